"""People's accounts (CalDAV, CardDAV, IMAP, SMTP, ICS): what is stored, where the password goes.

:mod:`chalie.accounts.spec` is one account as stored, :mod:`chalie.accounts.store`
the table in ``chalie.db`` and the passwords in the 0600 secrets file,
:mod:`chalie.accounts.failure` the structured errors every protocol client
raises, :mod:`chalie.personal.probe` what ``chalie accounts test`` reports.
"""
