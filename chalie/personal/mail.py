"""Mail: IMAP to read (IMAPClient), SMTP to send (the standard library's smtplib).

:class:`Mailbox` is one logged-in IMAP session for one call: search, read
(text and HTML bodies as text, attachments listed, their text on request,
their bytes for the rich payload), append a draft, move, flag.
:func:`send` hands one message to an SMTP server. :func:`compose` builds a
message from what the model wrote and refuses a header that holds a line
break or a control character (header injection) before anything is built.

Every failure is an :class:`AccountFailure`: a refused or dropped
connection, a timeout, a server that hangs up mid-fetch are
``account-unreachable``; a refused login is ``auth-failed``.
"""

from __future__ import annotations

import base64
import datetime as dt
import email
import email.policy
import email.utils
import imaplib
import smtplib
import ssl
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from email.header import decode_header, make_header
from email.message import EmailMessage, Message
from html.parser import HTMLParser
from typing import Any, Final

from imapclient import IMAPClient
from imapclient.exceptions import IMAPClientAbortError, IMAPClientError, LoginError

from chalie.accounts.failure import AccountFailure
from chalie.accounts.store import Credentials
from chalie.personal.pdftext import pdf_text

MAX_BODY_TEXT: Final = 20_000
MAX_SEARCH: Final = 100
SNIPPET: Final = 200
_HEADER_BAD: Final = frozenset(chr(c) for c in [*range(0, 32), 127]) - {"\t"}
_SPECIAL_DRAFTS: Final = b"\\Drafts"
_SPECIAL_SENT: Final = b"\\Sent"


# -- HTML to text ---------------------------------------------------------------------------


class _Text(HTMLParser):
    BLOCK: Final = frozenset(
        {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol",
         "blockquote", "pre", "hr", "section", "article", "header", "footer"}
    )  # fmt: skip
    SKIP: Final = frozenset({"script", "style", "head", "title", "template"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")
        if tag == "li":
            self.parts.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self._skip:
            self._skip -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


# -- headers -------------------------------------------------------------------------------


def decoded(value: Any) -> str:
    """A header (bytes or str, maybe RFC 2047 encoded) as text."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        return str(make_header(decode_header(str(value))))
    except (ValueError, LookupError, UnicodeError):
        return str(value)


def _address(addr: Any) -> str:
    mailbox = decoded(addr.mailbox) if addr.mailbox else ""
    host = decoded(addr.host) if addr.host else ""
    at = f"{mailbox}@{host}" if host else mailbox
    name = decoded(addr.name) if addr.name else ""
    return f"{name} <{at}>" if name else at


def check_header(name: str, value: str) -> str:
    """The value if it may stand in a header; a header injection attempt is refused."""
    bad = next((c for c in value if c in _HEADER_BAD), None)
    if bad is not None:
        raise AccountFailure(
            "invalid-param",
            f"{name} holds a line break or control character ({bad!r}); headers are one line",
            hint=f"write {name} on one line, with no line breaks.",
            param=name,
        )
    return value


def check_addresses(name: str, values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for raw in values:
        check_header(name, raw)
        display, addr = email.utils.parseaddr(raw)
        if (
            not addr
            or addr.count("@") != 1
            or any(c in addr for c in " ,;<>\"'")
            or not addr.split("@")[1]
        ):
            raise AccountFailure(
                "invalid-param",
                f"{name}: {raw[:100]!r} is not an email address",
                hint="pass addresses like sam@example.com or 'Sam Lee <sam@example.com>'; "
                "look a name up with the contacts tool first.",
                param=name,
            )
        out.append(email.utils.formataddr((display, addr)) if display else addr)
    return out


@dataclass(frozen=True)
class Draft:
    to: list[str]
    subject: str
    body: str
    cc: list[str]
    bcc: list[str]


def compose(
    sender: str,
    draft: Draft,
    *,
    in_reply_to: str = "",
    references: str = "",
    attachments: Sequence[tuple[str, str, bytes]] = (),
) -> EmailMessage:
    """A message from what the model wrote; every header checked first (see check_header)."""
    to = check_addresses("to", draft.to)
    cc = check_addresses("cc", draft.cc)
    bcc = check_addresses("bcc", draft.bcc)
    subject = check_header("subject", draft.subject)
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = check_header("from", sender)
    if to:
        msg["To"] = ", ".join(to)
    if cc:
        msg["Cc"] = ", ".join(cc)
    if bcc:
        msg["Bcc"] = ", ".join(bcc)
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(localtime=True)
    domain = sender.rsplit("@", 1)[-1].strip(">") or "chalie.local"
    msg["Message-ID"] = email.utils.make_msgid(domain=domain)
    if in_reply_to:
        msg["In-Reply-To"] = check_header("in_reply_to", in_reply_to)
        msg["References"] = check_header("references", (references + " " + in_reply_to).strip())
    msg.set_content(draft.body)
    for filename, ctype, data in attachments:
        maintype, _, subtype = ctype.partition("/")
        msg.add_attachment(
            data, maintype=maintype, subtype=subtype or "octet-stream", filename=filename
        )
    return msg


# -- IMAP -----------------------------------------------------------------------------------

_TLS: list[ssl.SSLContext] = []


def _tls() -> ssl.SSLContext:
    """One verifying TLS context for the process (loading the CA store costs ~20 ms)."""
    if not _TLS:
        _TLS.append(ssl.create_default_context())
    return _TLS[0]


@contextmanager
def _failures(who: str) -> Iterator[None]:
    try:
        yield
    except AccountFailure:
        raise
    except LoginError:
        raise AccountFailure(
            "auth-failed", "the IMAP server refused the login", account=who
        ) from None
    except (IMAPClientAbortError, imaplib.IMAP4.abort, EOFError, OSError) as exc:
        # OSError covers refused, reset, timed out and TLS failures alike.
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise AccountFailure(
            "account-unreachable", f"the IMAP connection failed or was dropped ({why})", account=who
        ) from None
    except IMAPClientError as exc:
        text = str(exc)[:200]
        if "AUTHENTICATIONFAILED" in text.upper():
            raise AccountFailure(
                "auth-failed", "the IMAP server refused the login", account=who
            ) from None
        raise AccountFailure(
            "account-bad-response", f"the IMAP server said: {text}", account=who
        ) from None


def _criteria(
    *,
    sender: str | None,
    to: str | None,
    subject: str | None,
    text: str | None,
    since: dt.date | None,
    before: dt.date | None,
    unread: bool | None,
    flagged: bool | None,
) -> list[Any]:
    crit: list[Any] = []
    for key, value in (("FROM", sender), ("TO", to), ("SUBJECT", subject), ("TEXT", text)):
        if value:
            crit += [key, check_header(key.lower(), value)]
    if since is not None:
        crit += ["SINCE", since]
    if before is not None:
        crit += ["BEFORE", before]
    if unread is True:
        crit.append("UNSEEN")
    elif unread is False:
        crit.append("SEEN")
    if flagged is True:
        crit.append("FLAGGED")
    elif flagged is False:
        crit.append("UNFLAGGED")
    return crit or ["ALL"]


def _text_of(part: Message) -> str:
    try:
        payload = (
            part.get_content() if hasattr(part, "get_content") else part.get_payload(decode=True)
        )
    except (LookupError, ValueError, AssertionError):
        raw = part.get_payload(decode=True)
        payload = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
    if isinstance(payload, bytes):
        payload = payload.decode(part.get_content_charset() or "utf-8", "replace")
    text = str(payload).replace("\r\n", "\n").replace("\r", "\n").strip()
    return html_to_text(text) if part.get_content_type() == "text/html" else text


def _attachments(msg: EmailMessage) -> list[Message]:
    return list(msg.iter_attachments())


class Mailbox:
    """One IMAP session: open with :meth:`connect`, close with :meth:`close` (or ``with``)."""

    def __init__(self, creds: Credentials, timeout: float, max_message_bytes: int) -> None:
        self.account = creds.account
        self.who = creds.account.name
        self._creds = creds
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self.client: IMAPClient | None = None

    def __enter__(self) -> Mailbox:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        a = self.account
        with _failures(self.who):
            ctx = _tls() if a.security != "none" else None
            client = IMAPClient(
                a.host,
                port=a.effective_port,
                ssl=a.security == "tls",
                ssl_context=ctx if a.security == "tls" else None,
                timeout=self.timeout,
            )
            self.client = client
            try:
                if a.security == "starttls":
                    client.starttls(_tls())
                client.login(a.username, self._creds.password)
            except BaseException:
                self.client = None
                try:
                    client.shutdown()
                except OSError:
                    pass
                raise

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                client.logout()
            except (IMAPClientError, OSError, EOFError, imaplib.IMAP4.abort):
                try:
                    client.shutdown()
                except OSError:
                    pass

    @property
    def c(self) -> IMAPClient:
        assert self.client is not None, "connect() first"
        return self.client

    # -- folders -------------------------------------------------------------------------
    def folders(self) -> list[dict[str, Any]]:
        with _failures(self.who):
            out = []
            for flags, _, name in self.c.list_folders():
                out.append({"name": name, "flags": [f.decode() for f in flags]})
            return out

    def special(self, flag: bytes, fallback: str) -> str:
        with _failures(self.who):
            for flags, _, name in self.c.list_folders():
                if flag in flags:
                    return str(name)
        return fallback

    def _select(self, folder: str, *, readonly: bool) -> dict[bytes, Any]:
        with _failures(self.who):
            try:
                info: dict[bytes, Any] = self.c.select_folder(folder, readonly=readonly)
                return info
            except (IMAPClientAbortError, imaplib.IMAP4.abort):
                raise
            except IMAPClientError as exc:
                # A NO to SELECT: no such folder, or a name the server refuses.
                raise AccountFailure(
                    "item-not-found",
                    f"cannot open a folder named {folder[:80]!r} ({str(exc)[:120]})",
                    account=self.who,
                    hint="call with action folders to see the folder names.",
                    param="folder",
                ) from None

    def status(self, folder: str = "INBOX") -> dict[str, int]:
        with _failures(self.who):
            st = self.c.folder_status(folder, [b"MESSAGES", b"UNSEEN"])
            return {"messages": int(st[b"MESSAGES"]), "unread": int(st[b"UNSEEN"])}

    # -- search and read ------------------------------------------------------------------
    def search(self, folder: str, limit: int, **criteria: Any) -> tuple[int, list[dict[str, Any]]]:
        """(how many match, the newest ``limit`` of them with their envelope and flags)."""
        self._select(folder, readonly=True)
        crit = _criteria(**criteria)
        with _failures(self.who):
            if b"SORT" in self.c.capabilities():
                uids = list(self.c.sort(["REVERSE", "ARRIVAL"], crit, charset="UTF-8"))
            else:
                uids = sorted(self.c.search(crit, charset="UTF-8"), reverse=True)
            picked = uids[: max(1, min(limit, MAX_SEARCH))]
            data = (
                self.c.fetch(picked, ["ENVELOPE", "FLAGS", "RFC822.SIZE", "BODYSTRUCTURE"])
                if picked
                else {}
            )
        out = []
        for uid in picked:
            item = data.get(uid)
            if item is None:
                continue
            out.append(self._summary(uid, folder, item))
        return len(uids), out

    def _summary(self, uid: int, folder: str, item: dict[bytes, Any]) -> dict[str, Any]:
        env = item.get(b"ENVELOPE")
        flags = [f.decode() if isinstance(f, bytes) else str(f) for f in item.get(b"FLAGS", ())]
        out: dict[str, Any] = {"id": uid, "folder": folder}
        if env is not None:
            out["from"] = ", ".join(_address(a) for a in env.from_ or ())
            out["to"] = ", ".join(_address(a) for a in env.to or ())
            out["subject"] = decoded(env.subject)
            out["date"] = env.date.isoformat() if env.date else ""
        out["unread"] = "\\Seen" not in flags
        if "\\Flagged" in flags:
            out["flagged"] = True
        out["size"] = int(item.get(b"RFC822.SIZE", 0))
        body = item.get(b"BODYSTRUCTURE")
        if body is not None and getattr(body, "is_multipart", False):
            out["has_attachments"] = _has_attachment(body)
        return out

    def fetch(self, folder: str, uid: int) -> EmailMessage:
        """The whole message, read without setting \\Seen; its size checked first."""
        self._select(folder, readonly=True)
        with _failures(self.who):
            sized = self.c.fetch([uid], ["RFC822.SIZE"])
            if uid not in sized:
                raise AccountFailure(
                    "item-not-found",
                    f"no message {uid} in {folder}",
                    account=self.who,
                    param="id",
                )
            size = int(sized[uid].get(b"RFC822.SIZE", 0))
            if size > self.max_message_bytes:
                raise AccountFailure(
                    "invalid-param",
                    f"message {uid} is {size // 2**20} MB, over the "
                    f"{self.max_message_bytes // 2**20} MB limit",
                    account=self.who,
                    hint="open it in a mail client; its headers are in the search result.",
                    param="id",
                )
            got = self.c.fetch([uid], ["BODY.PEEK[]", "FLAGS"])
        raw = got.get(uid, {}).get(b"BODY[]")
        if not isinstance(raw, bytes):
            raise AccountFailure(
                "account-unreachable",
                f"the server sent no body for message {uid} (the connection may have dropped)",
                account=self.who,
            )
        if len(raw) < size:
            raise AccountFailure(
                "account-unreachable",
                f"message {uid} arrived cut short ({len(raw)} of {size} bytes)",
                account=self.who,
            )
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        return msg

    def append(self, folder: str, msg: EmailMessage, flags: Sequence[bytes]) -> int | None:
        with _failures(self.who):
            answer = self.c.append(
                folder, msg.as_bytes(policy=email.policy.SMTP), flags=list(flags)
            )
        # APPENDUID (RFC 4315): "[APPENDUID <validity> <uid>] ..."
        text = answer.decode("ascii", "replace") if isinstance(answer, bytes) else str(answer)
        if "APPENDUID" in text:
            try:
                return int(text.split("APPENDUID", 1)[1].split("]")[0].split()[1])
            except (IndexError, ValueError):
                return None
        return None

    def _require(self, folder: str, uids: Sequence[int]) -> None:
        """Refuse (item-not-found, naming the first) unless every message is in the folder."""
        existing = self.c.fetch(list(uids), ["FLAGS"])
        missing = [u for u in uids if u not in existing]
        if missing:
            raise AccountFailure(
                "item-not-found",
                f"no message {missing[0]} in {folder}",
                account=self.who,
                param="id",
            )

    def move(self, folder: str, uids: Sequence[int], target: str) -> None:
        self._select(folder, readonly=False)
        with _failures(self.who):
            self._require(folder, uids)
            if not self.c.folder_exists(target):
                raise AccountFailure(
                    "item-not-found",
                    f"no folder named {target[:80]!r}",
                    account=self.who,
                    hint="call with action folders to see the folder names.",
                    param="to_folder",
                )
            if b"MOVE" in self.c.capabilities():
                self.c.move(list(uids), target)
            else:
                self.c.copy(list(uids), target)
                self.c.delete_messages(list(uids))
                self.c.uid_expunge(list(uids))

    def flag(
        self, folder: str, uids: Sequence[int], add: Sequence[bytes], remove: Sequence[bytes]
    ) -> dict[int, list[str]]:
        self._select(folder, readonly=False)
        with _failures(self.who):
            self._require(folder, uids)
            if add:
                self.c.add_flags(list(uids), list(add))
            if remove:
                self.c.remove_flags(list(uids), list(remove))
            after = self.c.fetch(list(uids), ["FLAGS"])
        return {u: [f.decode() for f in after[u][b"FLAGS"]] for u in uids if u in after}


def _has_attachment(body: Any) -> bool:
    try:
        parts = body[0] if body.is_multipart else []
        for part in parts:
            if getattr(part, "is_multipart", False):
                if _has_attachment(part):
                    return True
                continue
            disposition = part[8] if len(part) > 8 else None
            if (
                disposition
                and isinstance(disposition, tuple)
                and disposition[0].lower() == b"attachment"
            ):
                return True
    except (IndexError, TypeError, AttributeError):
        return False
    return False


def reading(
    msg: EmailMessage, *, extract: Sequence[int], download: Sequence[int], max_rich_bytes: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(what the model reads of a message, the files for the rich payload).

    The files handed over (base64, a third larger) fit in ``max_rich_bytes`` together,
    in the order asked; one that does not fit is listed with a ``file_note`` instead.
    """
    budget = max_rich_bytes
    body_part = msg.get_body(preferencelist=("plain", "html"))
    text = _text_of(body_part) if body_part is not None else ""
    out: dict[str, Any] = {
        "from": decoded(msg.get("From")),
        "to": decoded(msg.get("To")),
        "subject": decoded(msg.get("Subject")),
        "date": str(msg.get("Date", "")),
        "message_id": str(msg.get("Message-ID", ""))[:300],
    }
    if msg.get("Cc"):
        out["cc"] = decoded(msg.get("Cc"))
    out["body"] = text[:MAX_BODY_TEXT]
    if len(text) > MAX_BODY_TEXT:
        out["body_truncated"] = len(text)
    listed = []
    files: list[dict[str, Any]] = []
    for index, part in enumerate(_attachments(msg)):
        data = part.get_payload(decode=True)
        size = len(data) if isinstance(data, bytes) else 0
        entry: dict[str, Any] = {
            "index": index,
            "filename": decoded(part.get_filename() or f"attachment-{index}")[:200],
            "content_type": part.get_content_type(),
            "size": size,
        }
        if index in extract:
            if part.get_content_maintype() == "text":
                extracted = _text_of(part)
                entry["text"] = extracted[:MAX_BODY_TEXT]
            elif part.get_content_type() == "application/pdf" or (
                entry["filename"].lower().endswith(".pdf")
                and part.get_content_type() == "application/octet-stream"
            ):
                pdf = pdf_text(data if isinstance(data, bytes) else b"", MAX_BODY_TEXT)
                entry["text"] = pdf.text
                if pdf.note:
                    entry["text_note"] = pdf.note
            else:
                entry["text_note"] = f"no text can be extracted from {part.get_content_type()}"
        if index in download:
            cost = (size + 2) // 3 * 4 + 1024  # base64 and the entry's other fields
            if cost > budget:
                entry["file_note"] = (
                    f"too large to hand over here ({size // 2**20} MB; at most "
                    f"{max_rich_bytes * 3 // 4 // 2**20} MB of files a call): the user can "
                    "open it in their mail client"
                )
            elif isinstance(data, bytes):
                budget -= cost
                files.append(
                    {
                        "filename": entry["filename"],
                        "content_type": entry["content_type"],
                        "size": size,
                        "data_base64": base64.b64encode(data).decode("ascii"),
                    }
                )
                entry["file"] = "in the rich payload"
        listed.append(entry)
    out["attachments"] = listed
    return out, files


# -- SMTP -----------------------------------------------------------------------------------


def _smtp_session(creds: Credentials, timeout: float) -> smtplib.SMTP:
    """A connection to the account's SMTP server, greeted, encrypted as configured and logged
    in (when the account has a user name); closed again when any of that fails."""
    a = creds.account
    ctx = _tls()
    smtp: smtplib.SMTP
    if a.security == "tls":
        smtp = smtplib.SMTP_SSL(a.host, a.effective_port, timeout=timeout, context=ctx)
    else:
        smtp = smtplib.SMTP(a.host, a.effective_port, timeout=timeout)
    try:
        smtp.ehlo()
        if a.security == "starttls":
            smtp.starttls(context=ctx)
            smtp.ehlo()
        if a.username:
            smtp.login(a.username, creds.password)
    except BaseException:
        smtp.close()
        raise
    return smtp


def send(creds: Credentials, msg: EmailMessage, timeout: float) -> list[str]:
    """Hand ``msg`` to the account's SMTP server; the recipients it accepted."""
    a = creds.account
    who = a.name
    recipients = [
        addr
        for _, addr in email.utils.getaddresses(
            [str(v) for k in ("To", "Cc", "Bcc") for v in msg.get_all(k, [])]
        )
    ]
    if not recipients:
        raise AccountFailure("invalid-param", "the message has no recipient", param="to")
    try:
        with _smtp_session(creds, timeout) as smtp:
            del msg["Bcc"]
            refused = smtp.send_message(msg, to_addrs=recipients)
    except smtplib.SMTPAuthenticationError:
        raise AccountFailure(
            "auth-failed", "the SMTP server refused the login", account=who
        ) from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise AccountFailure(
            "invalid-param",
            f"the server refused every recipient ({', '.join(list(exc.recipients)[:5])})",
            account=who,
            param="to",
        ) from None
    except (smtplib.SMTPServerDisconnected, smtplib.SMTPConnectError, OSError) as exc:
        raise AccountFailure(
            "account-unreachable", f"the SMTP connection failed ({type(exc).__name__})", account=who
        ) from None
    except smtplib.SMTPException as exc:
        raise AccountFailure(
            "account-bad-response",
            f"the SMTP server refused the message ({str(exc)[:160]})",
            account=who,
        ) from None
    return [r for r in recipients if r not in refused]


def probe_smtp(creds: Credentials, timeout: float) -> dict[str, Any]:
    a = creds.account
    try:
        with _smtp_session(creds, timeout) as smtp:
            extensions = sorted(smtp.esmtp_features)
    except smtplib.SMTPAuthenticationError:
        raise AccountFailure(
            "auth-failed", "the SMTP server refused the login", account=a.name
        ) from None
    except (smtplib.SMTPException, OSError) as exc:
        raise AccountFailure(
            "account-unreachable",
            f"the SMTP connection failed ({type(exc).__name__})",
            account=a.name,
        ) from None
    return {"extensions": extensions, "authenticated": bool(a.username)}


DRAFTS_FLAG: Final = _SPECIAL_DRAFTS
SENT_FLAG: Final = _SPECIAL_SENT
