"""The errors a bad checkpoint or chat raises, apart from the code that raises them (the loader: torch and Triton;
the chat template: Jinja2 and the tokenizer package), so the CLI can report them as the user's mistake without
importing it."""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model; the message names the tensor."""


class ChatTemplateError(ValueError):
    """No template, a template that called raise_exception, or one that failed to render."""
