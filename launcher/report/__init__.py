"""What the user reads and looks at: the launch summary (`summary`) and the run's pictures (`plots`)."""
