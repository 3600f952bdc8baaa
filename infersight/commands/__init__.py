"""One module per `infersight` subcommand; each exposes `register(subparsers)`.

A command parses its arguments, calls a library function and prints; nothing else lives here.
"""
