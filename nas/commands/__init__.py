"""One module per `dreams-nas` subcommand: a parser builder plus one library call."""
