"""The sandbox: everything the host does with an agent's container.

Cold and warm containers, the hardened container config and mounts, the
image, workspace quotas, the model gateway, and the two rules for what comes
back across the wall: ``hostile_fs`` (files, symlinks, sockets) and
``bounded_io`` (output).  Imports ``core``, ``model`` and ``store``; never
the run path or a face.
"""
