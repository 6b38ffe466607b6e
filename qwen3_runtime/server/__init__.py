"""The OpenAI-compatible HTTP server: an API process (FastAPI) in front of an engine process owning the Runtime.

See docs/ARCHITECTURE.md ("Serving") for the process layout and the messages between the two.
"""
