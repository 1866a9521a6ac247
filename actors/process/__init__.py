"""The process's actors: the supervisor, the HTTP servers, the control socket."""
