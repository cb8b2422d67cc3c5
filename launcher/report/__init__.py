"""What the user reads and looks at: the launch summary (`summary`), the loss curves (`plots`), and a run's
pictures (`pictures`: training.png and gpus.png, the GPU monitor's logs read by `dmon`); `python -m
launcher.report RUN_OR_BUNDLE` draws them."""
