"""``python -m polygym`` is the ``gym`` command.

``python -m`` puts the working directory first on ``sys.path``; a user's own
``resources_servers/`` folder there (without ``__init__.py``) would then shadow the installed
package of the same name. The ``gym`` console script has no such entry, so drop it to behave the
same; user folders are loaded from their files by ``polygym.stack.loader``.
"""

import os
import sys

if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.realpath(os.getcwd()):
    sys.path.pop(0)

from polygym.cli import main

main()
