"""The ``pipeline`` command line: the parser and one thin module per command."""
