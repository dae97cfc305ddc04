"""The `v100lab` command: the dispatcher and one module per subcommand."""
