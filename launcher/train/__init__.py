"""The training job started by torchrun on every node (run_train.py): its core here (the entry, the config as the
engines read it, the job's environment, data, metrics, stop requests), one package per engine (`torch_engine`,
`nanotron_engine`). Of launcher code it imports only `launcher.nanotron_config` and the ground floor."""
