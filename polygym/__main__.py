"""``python -m polygym`` is the ``gym`` command."""

from polygym.cli import main

main()
