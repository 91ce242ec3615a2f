"""Every workaround for the installed Paddle, each gated on its version."""
