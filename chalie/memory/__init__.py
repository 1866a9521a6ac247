"""Memory: what Chalie keeps about the person (and, apart, what each agent keeps).

``records`` (the record and its kinds), ``whose`` (which principal a turn
stores for and reads from), ``store`` (the ``memories`` table in chalie.db),
``index`` (the semantic and keyword indexes, apart from the tool index),
``fusion`` (how a recall ranks: the lists fused, then lifted; what a recall
shows under a token budget), ``when`` (times and periods, relative ones read
in the person's zone), ``book`` (the service every entry point uses: the
ability, the CLI, the background passes), ``briefing`` (the memories a turn
carries into its request before the model is asked).
"""
