"""What runs the runs: images and their catalog, requirement locks, the Docker engine, MNIST on the host, host facts."""
