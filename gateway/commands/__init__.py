"""Sub-commands of the `bastion` CLI, one module each, registered by `gateway.cli`."""
