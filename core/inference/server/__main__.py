"""``python -m core.inference.server``: SGLang's ``launch_server`` arguments, our engine."""

from core.inference.server.app import main

main()
