"""What the user reads and looks at: the launch summary (`summary`), a run's pictures (`pictures`: loss.png,
training.png and gpus.png, the GPU monitor's logs read by `dmon`) and what differs between two runs (`compare`);
`python -m launcher.report RUN_OR_BUNDLE` draws the pictures."""
