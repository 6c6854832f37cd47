"""Command line: thin wrappers that parse arguments, call the layers below and pick a renderer."""
