"""Memory: what Chalie keeps about the person (and, apart, what each agent keeps).

``records`` (the record and its kinds), ``whose`` (which principal a turn
stores for and reads from), ``store`` (the ``memories`` table in chalie.db),
``index`` (the semantic and keyword indexes, apart from the tool index),
``book`` (the service every entry point uses: the ability, the CLI, the
background passes).
"""
