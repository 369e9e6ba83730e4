"""A running stack: config merging, the catalog of server folders, the launcher and its backends,
the head server's registry and the records that let another terminal find a stack."""
