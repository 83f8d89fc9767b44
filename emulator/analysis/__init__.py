"""What the model says about a fabric before anything runs: limits, scale, lower bounds."""
