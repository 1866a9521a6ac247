"""The protocols of people's accounts, as pure clients: WebDAV (CalDAV, CardDAV), ICS,
IMAP, SMTP, Open-Meteo. Each raises :class:`chalie.accounts.failure.AccountFailure`;
the abilities in ``abilities/`` are thin shells over them."""
