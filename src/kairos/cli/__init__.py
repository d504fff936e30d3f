"""The `kairos` command line: thin, it parses arguments, calls the client and formats."""

from kairos.cli.main import main

__all__ = ["main"]
