"""One module per ``v100lab`` subcommand (see ``v100lab.cli.main``)."""
