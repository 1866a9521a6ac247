"""email: search and read mail over IMAP, save drafts, reply, send over SMTP, move and flag.

Message bodies and attachments are written by others: every result that
carries them is marked untrusted. Sending (``send``, and ``reply`` with
``send=true``, which then names its recipients in ``to``) is the permission
``email.send``, declared sensitive through :meth:`reach`, whose line shows the
recipients, the subject and the body. A ``move`` to a trash or junk folder (by its name:
:data:`TRASH`) is a delete, sensitive too.
A header the model wrote with a line break in it is refused (header injection).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec

from chalie.ability import Ability
from chalie.accounts.failure import AccountFailure
from chalie.accounts.spec import Account
from chalie.calls.untrusted import success as untrusted_success
from chalie.gate.display import one_line
from chalie.result import MAX_RICH_BYTES, ToolResult

if TYPE_CHECKING:
    from chalie.personal import mail
    from chalie.personal.runtime import PersonalRuntime

Line = Annotated[str, msgspec.Meta(max_length=998)]
Address = Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
Addresses = Annotated[list[Address], msgspec.Meta(max_length=50)]
Folder = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Day = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}$", description="YYYY-MM-DD")]
Indexes = Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=999)]], msgspec.Meta(max_length=20)]
# What the dispatcher lets through as a rich payload, less room for the rest of it.
MAX_FILES_BYTES = MAX_RICH_BYTES - 64 * 1024


class EmailParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read, search, write and send the user's mail."""

    action: Literal["search", "read", "folders", "draft", "reply", "send", "move", "flag"] = (
        "search"
    )
    account: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    folder: Folder = "INBOX"
    id: Annotated[int, msgspec.Meta(ge=1, description="a message id from search")] | None = None
    # search
    sender: Line | None = None
    recipient: Line | None = None
    subject: Line | None = None
    text: Line | None = None
    since: Day | None = None
    before: Day | None = None
    unread: bool | None = None
    flagged: bool | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20
    # read
    extract: Indexes = []
    download: Indexes = []
    # draft, reply, send
    to: Addresses = []
    cc: Addresses = []
    bcc: Addresses = []
    body: Annotated[str, msgspec.Meta(max_length=200_000)] | None = None
    send: bool = False
    # move, flag
    to_folder: Folder | None = None
    mark: Literal["read", "unread", "flagged", "unflagged"] | None = None


# A folder a move to deletes the message (or soon will: servers empty them), by the names
# mail clients give them; the last part of a path ("[Gmail]/Trash", "INBOX.Deleted Items").
TRASH: Final = re.compile(
    r"(^|[/.\]])\s*(trash|bin|deleted( items| messages)?|junk( e-?mail)?|spam|papierkorb|"
    r"corbeille|papelera|cestino|prullenbak)\s*$",
    re.IGNORECASE,
)


def _trashes(params: Mapping[str, Any]) -> bool:
    folder = params.get("to_folder")
    return params.get("action") == "move" and isinstance(folder, str) and bool(TRASH.search(folder))


def _sends(params: Mapping[str, Any]) -> bool:
    action = params.get("action", "search")
    return action == "send" or (action == "reply" and params.get("send") is True)


class Email(Ability):
    name = "email"
    summary = (
        "The user's own email: search the inbox and mail folders (by sender, subject, date, "
        "words, unread), open a message and its attachments, write drafts, reply, send email, "
        "file messages into folders and mark them read, unread or flagged."
    )
    tooltip = "Email: search, read, draft, send"
    examples = (
        "email Sam the agenda",
        "do I have any unread emails",
        "find the email from Alice about the invoice",
        "open the latest email from my boss",
        "reply to that email and say I'll be there",
        "send an email to jo@example.com saying the report is ready",
        "move the newsletter emails to the archive folder",
        "draft an email to the team about Friday's meeting",
    )
    Params = EmailParams
    actions = {
        "search": (),
        "read": ("id",),
        "folders": (),
        "draft": ("subject", "body"),
        "reply": ("id", "body"),
        "send": ("to", "subject", "body"),
        "move": ("id", "to_folder"),
        "flag": ("id", "mark"),
    }
    timeout = 120.0

    def classify(self, params: Mapping[str, Any]) -> str | None:
        """Whatever leaves the machine is ``email.send``; a reply kept as a draft, ``draft``."""
        if _sends(params):
            return "send"
        action = params.get("action", "search")
        return "draft" if action == "reply" else str(action)

    def reach(self, params: Mapping[str, Any]) -> str | None:
        """Sending (and a reply that sends), and a move to a trash or junk folder (a delete)."""
        if _trashes(params):
            folder = one_line(str(params["to_folder"]), 100)
            return one_line(
                f"moves message {params.get('id')} to {folder!r}: deletes it "
                "(the server may empty that folder)",
                300,
            )
        if not _sends(params):
            return None
        to = ", ".join(params.get("to") or [])
        cc = ", ".join(params.get("cc") or [])
        bcc = ", ".join(params.get("bcc") or [])
        what = "replies to message" if params.get("action") == "reply" else "sends mail"
        parts = [f"{what} to {to}"]
        if cc:
            parts.append(f"cc {cc}")
        if bcc:
            parts.append(f"bcc {bcc}")
        if params.get("subject"):
            parts.append(f"subject {params['subject']!r}")
        parts.append(f"body {one_line(params.get('body') or '', 300)!r}")
        return one_line("; ".join(parts), 1000)

    def run(self, params: EmailParams) -> ToolResult:
        from chalie.personal.runtime import with_accounts

        return with_accounts(self, lambda rt: self._run(rt, params))

    def _mailbox(self, rt: PersonalRuntime, name: str | None) -> mail.Mailbox:
        from chalie.personal import mail

        account = rt.accounts.pick(("imap",), name)
        return mail.Mailbox(
            rt.accounts.credentials(account), rt.settings.timeout, rt.settings.max_message_bytes
        )

    def _run(self, rt: PersonalRuntime, p: EmailParams) -> ToolResult:
        from chalie.personal import mail

        meta: dict[str, Any] = {"action": p.action}
        if p.action == "reply" and p.send and not p.to:
            # The permission prompt must show who receives it: they are named in the call.
            return ToolResult.error(
                "missing-params",
                "reply with send=true needs to= (the recipients).",
                hint="pass to= with the sender shown by read, or leave send=false to save the "
                "reply as a draft.",
                meta={"param": "to"},
            )
        if p.action == "send":
            return self._send(rt, p, meta)
        with self._mailbox(rt, p.account if p.action != "send" else None) as box:
            meta["account"] = box.who
            if p.action == "folders":
                return ToolResult.success({"folders": box.folders()}, meta=meta)
            if p.action == "search":
                total, found = box.search(
                    p.folder,
                    p.limit,
                    sender=p.sender,
                    to=p.recipient,
                    subject=p.subject,
                    text=p.text,
                    since=_day(p.since, "since"),
                    before=_day(p.before, "before"),
                    unread=p.unread,
                    flagged=p.flagged,
                )
                body = {"folder": p.folder, "total": total, "shown": len(found), "messages": found}
                return untrusted_success(body, meta={**meta, "total": total})
            assert p.id is not None
            if p.action == "read":
                msg = box.fetch(p.folder, p.id)
                shown, files = mail.reading(
                    msg, extract=p.extract, download=p.download, max_rich_bytes=MAX_FILES_BYTES
                )
                shown = {"id": p.id, "folder": p.folder, **shown}
                rich = {"attachments": files} if files else None
                return untrusted_success(shown, rich=rich, meta=meta)
            if p.action == "move":
                assert p.to_folder is not None
                box.move(p.folder, [p.id], p.to_folder)
                return ToolResult.success(
                    {"moved": p.id, "from": p.folder, "to": p.to_folder}, meta=meta
                )
            if p.action == "flag":
                add, remove = {
                    "read": ([b"\\Seen"], []),
                    "unread": ([], [b"\\Seen"]),
                    "flagged": ([b"\\Flagged"], []),
                    "unflagged": ([], [b"\\Flagged"]),
                }[p.mark or "read"]
                flags = box.flag(p.folder, [p.id], add, remove)
                return ToolResult.success({"id": p.id, "flags": flags.get(p.id, [])}, meta=meta)
            if p.action == "draft":
                msg = mail.compose(_sender(rt, box.account), _draft(p))
                return self._save_draft(box, msg, meta)
            # reply
            original = box.fetch(p.folder, p.id)
            msg = self._reply(rt, box.account, p, original)
            if not p.send:
                return self._save_draft(box, msg, meta)
        return self._deliver(rt, p.account, msg, meta)

    @staticmethod
    def _save_draft(box: mail.Mailbox, msg: Any, meta: dict[str, Any]) -> ToolResult:
        from chalie.personal import mail

        folder = box.special(mail.DRAFTS_FLAG, "Drafts")
        uid = box.append(folder, msg, [b"\\Draft", b"\\Seen"])
        return ToolResult.success(
            {
                "saved_to": folder,
                "id": uid,
                "to": str(msg.get("To", "")),
                "subject": str(msg.get("Subject", "")),
            },
            meta=meta,
        )

    def _reply(self, rt: PersonalRuntime, account: Account, p: EmailParams, original: Any) -> Any:
        from chalie.personal import mail

        to = p.to or [str(original.get("Reply-To") or original.get("From") or "")]
        subject = p.subject or mail.decoded(original.get("Subject"))
        if not subject.lower().startswith("re:"):
            subject = f"Re: {subject}"
        draft = mail.Draft(
            to=[mail.decoded(t) for t in to],
            subject=" ".join(subject.split()),
            body=p.body or "",
            cc=list(p.cc),
            bcc=list(p.bcc),
        )
        return mail.compose(
            _sender(rt, account),
            draft,
            in_reply_to=str(original.get("Message-ID", "")).strip(),
            references=" ".join(str(original.get("References", "")).split()),
        )

    def _send(self, rt: PersonalRuntime, p: EmailParams, meta: dict[str, Any]) -> ToolResult:
        from chalie.personal import mail

        smtp = _smtp_account(rt, p.account)
        msg = mail.compose(_sender(rt, smtp), _draft(p))
        return self._deliver(rt, p.account, msg, meta)

    def _deliver(
        self, rt: PersonalRuntime, name: str | None, msg: Any, meta: dict[str, Any]
    ) -> ToolResult:
        from chalie.personal import mail

        smtp = _smtp_account(rt, name)
        accepted = mail.send(rt.accounts.credentials(smtp), msg, rt.settings.timeout)
        body: dict[str, Any] = {
            "sent": True,
            "to": accepted,
            "subject": str(msg.get("Subject", "")),
            "message_id": str(msg.get("Message-ID", "")),
        }
        try:  # a copy in Sent, when there is an IMAP account to keep it in
            imap = rt.accounts.pick(("imap",), None)
            with mail.Mailbox(
                rt.accounts.credentials(imap), rt.settings.timeout, rt.settings.max_message_bytes
            ) as box:
                folder = box.special(mail.SENT_FLAG, "Sent")
                box.append(folder, msg, [b"\\Seen"])
                body["saved_to"] = folder
        except AccountFailure as exc:
            body["saved_to"] = None
            body["note"] = f"sent, but no copy was kept: {exc.code}"
        return ToolResult.success(body, meta={**meta, "account": smtp.name})


def _smtp_account(rt: PersonalRuntime, name: str | None) -> Account:
    if name:
        named = rt.accounts.get(name)
        if named is not None and named.kind == "smtp":
            return named
    return rt.accounts.pick(("smtp",), None)


def _sender(rt: PersonalRuntime, account: Account) -> str:
    for a in (account, *rt.accounts.list("smtp"), *rt.accounts.list("imap")):
        if a.address:
            return a.address
    if "@" in account.username:
        return account.username
    raise AccountFailure(
        "invalid-param",
        "the mail account has no address to send from",
        account=account.name,
        hint="ask the user to add the account again with --address.",
    )


def _draft(p: EmailParams) -> mail.Draft:
    from chalie.personal import mail

    return mail.Draft(
        to=list(p.to), subject=p.subject or "", body=p.body or "", cc=list(p.cc), bcc=list(p.bcc)
    )


def _day(text: str | None, param: str) -> dt.date | None:
    if text is None:
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise AccountFailure(
            "invalid-param", f"{param}={text!r} is not a date", param=param
        ) from None
