"""The training job started by torchrun on every node (run_train.py): torch and nanotron engines."""
