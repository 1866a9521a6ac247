"""pykka actors: thin shells that own state, mailboxes and lifecycles."""
