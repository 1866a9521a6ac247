"""The inbound MCP server: ``talk_to_chalie`` over Streamable HTTP, behind named bearer tokens.

Modules: ``validation`` (the tool's arguments), ``limits`` (per-token limits),
``gate`` (the ASGI auth and limits wrapper), ``turns`` (the channel and origin of
an agent's turns), ``owners`` (which token owns which conversation), ``exchange``
(``loop_in_human`` events), ``talk`` (the tool body), ``app`` (the server).
"""
