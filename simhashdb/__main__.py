"""python -m simhashdb: the same as simhashdb-cli."""

from .cli import main_exit

main_exit()
