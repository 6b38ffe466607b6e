"""The building blocks the model families share, each over the kernels of ops/."""
