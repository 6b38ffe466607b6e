"""Model families: each one's shape (torch-free, read by config.py and the API process) and its module."""
