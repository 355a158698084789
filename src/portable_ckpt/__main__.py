"""``python -m portable_ckpt``: the ``portable-ckpt`` command (:func:`portable_ckpt.cli.main.main`)."""

import sys

from portable_ckpt.cli.main import entry

sys.exit(entry())
