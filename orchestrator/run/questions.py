"""Questions the agent asks its group (``ask_user``), and their answers.

A run that asks ends (``awaiting_answer``: a final state, its slot and lease let go of);
the question stays open on the group, as a ``questions`` row and the group's
``open_question`` mark (``store/questions.py``), shown in the chat as the agent's message
with an APPROVAL envelope (only the host stores one:
``model/envelopes.py``, :func:`~orchestrator.model.envelopes.refuse_host_envelope`).

It is closed once, by the first of:

* **an answer**: a button on a channel or the page, ``orchestrator answer``, the API, or a
  person's reply that names an option (its text or its number, case-insensitive; for a
  multiple choice several, separated by commas).  Who may answer: anyone in the chat, or
  the group's approvers (platform identities: the sender ids its channels give); the API
  and the command line answer as the operator.  The answer wakes the group.
* **a newer trigger** in the group (a message that wakes it and names no option): the
  question expires and that message is answered as usual;
* **its time** (``ORCHESTRATOR_QUESTION_TTL_S``): the sweeper expires it; nothing wakes.

What closes it is stored in the chat in the same transaction, for the model as the
asking run's agent will read it: for the built-in loop (``answer_as`` "tool_result") the
result of the ``ask_user`` call, placed right after the call in the model's view (it
carries the asking run's ``reply_to_seq``: ``model/views.py``); for Claude Code, whose
call had its result already ("message"), a user message in the answerer's name.
"""

from __future__ import annotations

import logging
import re
import secrets as random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from agent_runner.protocol import (
    MAX_OPTION_CHARS,
    MAX_OPTIONS,
    MAX_QUESTION_CHARS,
    MIN_OPTIONS,
    ApprovalPayload,
    QuestionEvent,
    envelope_to_dict,
)
from agent_runner.protocol import ApprovalEnvelope as ApprovalEnvelope
from orchestrator.core.errors import BadInput, Conflict, NotAllowed, NotFound
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.messages import SENDER_HOST, SENDER_SYSTEM, SENDER_TOOL_RESULT, NewMessage, StoredMessage
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.sandbox.config import parse_container_config
from orchestrator.sandbox.egress_policy import host_name
from orchestrator.store.db import Connection, Database, db_now
from orchestrator.store.deliveries import record_deliveries
from orchestrator.store.groups import mark_pending, routing
from orchestrator.store.message_log import insert_message, now_iso
from orchestrator.store.questions import (
    AnswerAs,
    Question,
    add_egress_rule,
    close_question,
    due_questions,
    get_question,
    insert_question,
    open_egress_question,
    open_question_of,
    set_answer_seq,
    set_message_seq,
)

log = logging.getLogger(__name__)

ASK_TOOL = "ask_user"
# Who answers through the API or the command line: they hold the token.
OPERATOR = "operator"
QUESTION_ID_KEY = "question_id"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NUMBER = re.compile(r"^\s*#?(\d{1,2})[.)]?\s*$")


# -- asking ---------------------------------------------------------------------------------


def question_refusal(event: QuestionEvent) -> str | None:
    """Why the host will not ask ``event``'s question (None: it will).  The runner checks the
    same, as a courtesy; what the sandbox writes is checked here."""
    question = event.question.strip()
    if not question:
        return "the question is empty"
    if len(question) > MAX_QUESTION_CHARS:
        return f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}"
    options = [o.strip() for o in event.options]
    if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
        return f"a question has {MIN_OPTIONS} to {MAX_OPTIONS} options, not {len(options)}"
    seen: set[str] = set()
    for i, option in enumerate(options, 1):
        if not option:
            return f"option {i} is empty"
        if len(option) > MAX_OPTION_CHARS:
            return f"option {i} is {len(option)} characters; the limit is {MAX_OPTION_CHARS} (a button's label)"
        if _CONTROL.search(option):
            return f"option {i} holds a line break or control character"
        if option.casefold() in seen:
            return f"option {i} ({option!r}) is given twice"
        if _NUMBER.match(option):
            return f"option {i} ({option!r}) is a bare number, which replies use to pick an option by its place"
        seen.add(option.casefold())
    return None


def question_text(question: str, options: Sequence[str], *, multiple: bool, allow_other: bool) -> str:
    """The question as text channels show it: the words, then the options numbered."""
    lines = [question.strip(), ""]
    lines += [f"{i}. {option}" for i, option in enumerate(options, 1)]
    how = (
        "Reply with the numbers or the options, separated by commas."
        if multiple
        else "Reply with a number or the option."
    )
    if allow_other:
        how += " Another answer is welcome through the page or `orchestrator answer --text`."
    return "\n".join([*lines, "", how])


def new_question(
    *,
    chat_jid: str,
    run_id: str,
    reply_to_seq: int,
    event: QuestionEvent,
    answer_as: AnswerAs,
    asked_at: datetime,
    ttl_s: float,
) -> Question:
    """The row for ``event`` (checked already with :func:`question_refusal`)."""
    return Question(
        id=random.token_hex(6),
        chat_jid=chat_jid,
        run_id=run_id,
        tool_use_id=event.tool_use_id,
        message_seq=None,
        reply_to_seq=reply_to_seq,
        question=event.question.strip(),
        options=[o.strip() for o in event.options],
        multiple=event.multiple,
        allow_other=event.allow_other,
        answer_as=answer_as,
        state="open",
        asked_at=asked_at,
        expires_at=asked_at + timedelta(seconds=ttl_s),
    )


def approval_envelope(question: Question) -> JsonObject:
    """The APPROVAL envelope of the message that shows ``question``."""
    payload = ApprovalPayload(
        question_id=question.id,
        question=question.question,
        options=list(question.options),
        multiple=question.multiple,
        allow_other=question.allow_other,
    )
    return envelope_to_dict(ApprovalEnvelope(payload=payload))


# -- answering ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """What an answer picks: options by their place (0-based) and, if allowed, free text."""

    picked: tuple[int, ...] = ()
    text: str | None = None


def parse_choice(question: Question, said: str) -> Choice | None:
    """The options ``said`` names (their text or number, case-insensitive; for a multiple
    choice, several separated by commas), or None when it names none or anything else."""
    parts = [p.strip() for p in said.split(",")] if question.multiple else [said.strip()]
    folded = [o.casefold() for o in question.options]
    picked: list[int] = []
    for part in parts:
        if not part:
            return None
        number = _NUMBER.match(part)
        if number and 1 <= int(number[1]) <= len(question.options):
            index = int(number[1]) - 1
        elif part.casefold() in folded:
            index = folded.index(part.casefold())
        else:
            return None
        if index not in picked:
            picked.append(index)
    return Choice(tuple(picked)) if picked else None


def may_answer_egress(approvers: Sequence[str] | None, sender: str) -> bool:
    """Whether ``sender`` may open the sandbox's network: the group's approvers, and the operator."""
    return sender == OPERATOR or (approvers is not None and sender in approvers)


def may_answer(approvers: Sequence[str] | None, sender: str) -> bool:
    """Whether ``sender`` may answer the group's questions (``approvers`` None: anyone in the chat)."""
    return approvers is None or sender == OPERATOR or sender in approvers


def _answer_words(question: Question, choice: Choice) -> str:
    words = [question.options[i] for i in choice.picked]
    if choice.text:
        words.append(choice.text)
    return ", ".join(words)


def _answer_json(question: Question, choice: Choice) -> JsonObject:
    return {
        "options": [question.options[i] for i in choice.picked],
        "indexes": list(choice.picked),
        "text": choice.text,
    }


def check_choice(question: Question, choice: Choice) -> None:
    """Refuse (:class:`BadInput`) a choice the question does not allow."""
    if choice.text is not None and not question.allow_other:
        raise BadInput("text", "this question takes one of its options, not free text")
    if choice.text is not None and not choice.text.strip():
        raise BadInput("text", "the answer's text is empty")
    if not choice.picked and choice.text is None:
        raise BadInput("option", "name an option (its text or its number)")
    if len(choice.picked) > 1 and not question.multiple:
        raise BadInput("option", "this question takes one option")
    if any(not 0 <= i < len(question.options) for i in choice.picked):
        raise BadInput("option", f"the question has options 1 to {len(question.options)}")


def _closing_message(
    question: Question,
    *,
    content: str,
    sender: str,
    sender_name: str,
    extra: JsonObject,
    stamp: str,
    message_type: str = "user",
) -> NewMessage:
    """What closes ``question`` in the chat, as its agent will read it (see the module's doc):
    for Claude Code (``answer_as`` "message") in ``sender``'s name as ``message_type``."""
    meta: JsonObject = {QUESTION_ID_KEY: question.id, **extra}
    if question.answer_as == "egress":
        # The host's own question: its close is the host's note, for people, never the model.
        sender, sender_name, message_type = SENDER_HOST, "host", "host"
    elif question.answer_as == "tool_result":
        # The call's result, where the model's view puts it: right after the call.
        meta.update({RUN_ID_KEY: question.run_id, "tool_use_id": question.tool_use_id, "tool": ASK_TOOL})
        meta["exit_code"] = 0
        if question.reply_to_seq is not None:
            meta[REPLY_TO_KEY] = question.reply_to_seq
        sender, sender_name, message_type = SENDER_TOOL_RESULT, ASK_TOOL, "tool_result"
    return NewMessage(
        id=f"{question.id}-closed",
        chat_jid=question.chat_jid,
        sender=sender,
        sender_name=sender_name,
        content=content,
        timestamp=stamp,
        message_type=message_type,
        metadata=meta,
    )


def _close(
    conn: Connection,
    db: Database,
    question: Question,
    new: NewMessage,
    *,
    state: str,
    why: str,
    wake: bool,
    answer: JsonObject | None = None,
    by: str | None = None,
    by_name: str | None = None,
    via: str | None = None,
) -> tuple[StoredMessage, int] | None:
    """Close ``question`` and store ``new`` in the caller's transaction; None if it was closed already."""
    closed = close_question(
        conn,
        question,
        state="answered" if state == "answered" else "expired",
        closed_at=db_now(conn),
        why=why,
        answer=answer,
        by=by,
        by_name=by_name,
        via=via,
    )
    if not closed:
        return None
    msg, created = insert_message(conn, db, new)
    set_answer_seq(conn, question.id, msg.seq)
    queued = record_deliveries(conn, msg) if created else 0
    if wake:
        mark_pending(conn, question.chat_jid, msg.seq)
    return msg, queued


@dataclass(frozen=True)
class Answered:
    """An answer taken: the question as it was, what was stored, deliveries queued."""

    question: Question
    message: StoredMessage
    queued: int
    answer: str


def answer_in(
    conn: Connection,
    db: Database,
    question: Question,
    choice: Choice,
    *,
    by: str,
    by_name: str,
    via: str,
    approvers: Sequence[str] | None,
) -> Answered:
    """Take ``choice`` as the answer to ``question`` in the caller's transaction (it wakes
    the group).  :class:`NotAllowed` for someone not among the approvers, :class:`BadInput`
    for a choice the question does not take, :class:`Conflict` once it is closed."""
    egress = question.answer_as == "egress"
    # The sandbox's network is the operator's and the approvers' to open, never anyone's.
    if not (may_answer_egress(approvers, by) if egress else may_answer(approvers, by)):
        who = (
            "the group's approvers (none are named: the operator only)"
            if egress and not approvers
            else "this group's approvers"
        )
        raise NotAllowed(f"{by_name or by} is not among {who}; the question stays open")
    check_choice(question, choice)
    if question.state != "open":
        raise Conflict(_closed_words(question))
    words = _answer_words(question, choice)
    stamp = now_iso()
    if egress:
        content = _egress_answer(conn, question, choice, by_name or by, via)
    elif question.answer_as == "tool_result":
        content = f"The group answered: {words}\n(by {by_name or by} via {via}, {stamp})"
    else:
        content = f'Answer to your question "{question.question}": {words}'
    new = _closing_message(
        question,
        content=content,
        sender=by,
        sender_name=by_name or by,
        extra={"answer": {**_answer_json(question, choice), "by": by, "by_name": by_name, "via": via}},
        stamp=stamp,
    )
    done = _close(
        conn,
        db,
        question,
        new,
        state="answered",
        why=f"answered by {by_name or by} via {via}",
        wake=not egress,  # the host's question: the agent's retry comes with a later run
        answer=_answer_json(question, choice),
        by=by,
        by_name=by_name,
        via=via,
    )
    if done is None:
        fresh = get_question(conn, question.id)
        raise Conflict(_closed_words(fresh or question))
    return Answered(question, done[0], done[1], words)


def _closed_words(question: Question) -> str:
    if question.state == "answered":
        who = question.answered_by_name or question.answered_by or "someone"
        picked = ", ".join((question.answer or {}).get("options") or []) or (question.answer or {}).get("text")
        return f"the question was answered already ({picked!s} by {who})"
    return f"the question is closed ({question.closed_why or question.state})"


@dataclass(frozen=True)
class Said:
    """An answer as a request spells it: options by their text or number, and free words."""

    options: Sequence[str] = ()
    text: str | None = None


def _no_option(question: Question, said: str) -> BadInput:
    numbered = ", ".join(f"{i}. {o}" for i, o in enumerate(question.options, 1))
    return BadInput("option", f"{said!r} names no option of the question ({numbered})")


def answer_question(
    db: Database,
    chat_jid: str,
    choice: Choice | Said | str,
    *,
    by: str = OPERATOR,
    by_name: str = OPERATOR,
    via: str,
    question_id: str | None = None,
) -> Answered:
    """Answer the chat's open question (or ``question_id``): ``choice`` as a :class:`Choice`,
    as a request spells it (:class:`Said`), or as a reply's words naming options.  :class:`NotFound` when there is none open (or no such
    question in the chat), else as :func:`answer_in`."""
    with db.transaction() as conn:
        group = routing(conn, chat_jid)  # the group's approvers, its row locked (PostgreSQL)
        if group is None:
            raise NotFound(f"no registered group for chat {chat_jid!r}")
        question = get_question(conn, question_id) if question_id else open_question_of(conn, chat_jid)
        if question is None or question.chat_jid != chat_jid:
            raise NotFound(
                f"no question {question_id!r} in chat {chat_jid!r}"
                if question_id
                else f"no open question in {chat_jid!r}"
            )
        if isinstance(choice, Said):
            choice = choice_of(question, choice.options, choice.text)
        elif isinstance(choice, str):
            parsed = parse_choice(question, choice)
            if parsed is None:
                if not question.allow_other:
                    raise _no_option(question, choice)
                parsed = Choice(text=choice.strip())
            choice = parsed
        return answer_in(conn, db, question, choice, by=by, by_name=by_name, via=via, approvers=group.approvers)


# -- the host's questions about the sandbox's network ----------------------------------------

ALLOW, REFUSE = "Allow", "Refuse"


def egress_rule(host: str, port: int) -> str:
    """The allowlist rule an "Allow" adds: the host, with its port unless it is HTTP's or HTTPS's."""
    return host if port in (80, 443) else f"{host}:{port}"


def egress_target(host: object, port: object) -> tuple[str, int]:
    """A question's host and port held to what the proxy takes as a target (``host_name``: a
    name of the rules' grammar, no ``*``, no ``_``; a port from 1 to 65535), normalised;
    ValueError saying why not.  The proxy refuses any other target before it notes it, so
    only a question stored some other way (forged, or from before the check) fails here."""
    if not isinstance(host, str):
        raise ValueError(f"{host!r} is not a host name")
    name = host_name(host)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a port (1 to 65535)")
    return name, port


def ask_about_egress(
    conn: Connection,
    db: Database,
    *,
    chat_jid: str,
    run_id: str,
    host: str,
    port: int,
    asked_at: datetime,
    ttl_s: float,
) -> tuple[StoredMessage, int] | None:
    """Ask the chat, in the caller's transaction, whether the group's sandbox may reach
    ``host:port`` (an ``ask`` policy refused it): a host message with an APPROVAL envelope, its
    options Allow and Refuse, answered by its id.  None when the chat is being asked already,
    or ``host:port`` is no target a rule can name (:func:`egress_target`): nothing is asked then."""
    try:
        host, port = egress_target(host, port)
    except ValueError as exc:
        log.warning("chat %s: not asking about %r:%r: %s", chat_jid, host, port, exc)
        return None
    if open_egress_question(conn, chat_jid, host, port) is not None:
        return None
    rule = egress_rule(host, port)
    question = Question(
        id=random.token_hex(6),
        chat_jid=chat_jid,
        run_id=run_id,
        tool_use_id="",
        message_seq=None,
        reply_to_seq=None,
        question=f"The agent's sandbox tried to reach {host}:{port}. Allow {rule} for this group?",
        options=[ALLOW, REFUSE],
        multiple=False,
        allow_other=False,
        answer_as="egress",
        subject={"host": host, "port": port},
        state="open",
        asked_at=asked_at,
        expires_at=asked_at + timedelta(seconds=ttl_s),
    )
    insert_question(conn, question, the_groups=False)
    content = (
        f"🌐 {question.question}\n\n1. {ALLOW}\n2. {REFUSE}\n\n"
        f"The approvers (or the operator: `orchestrator answer {chat_jid} allow --question {question.id}`) decide; "
        "the agent's next run may then retry."
    )
    new = NewMessage(
        id=f"{question.id}-asked",
        chat_jid=chat_jid,
        sender=SENDER_HOST,
        sender_name="host",
        content=content,
        timestamp=now_iso(),
        message_type="host",
        metadata=approval_envelope(question),
    )
    msg, created = insert_message(conn, db, new)
    set_message_seq(conn, question.id, msg.seq)
    return msg, record_deliveries(conn, msg) if created else 0


def _egress_answer(conn: Connection, question: Question, choice: Choice, who: str, via: str) -> str:
    """What an answer to the host's question does (an Allow adds the rule), as its note says it.

    An Allow adds exactly the question's host (with its port: :func:`egress_rule`), held to
    what the proxy takes as a target and the whole config to the validation ``groups set
    --network`` passes (``parse_container_config``: the policy's own rules); either refused
    is a :class:`BadInput` saying why, the group's config unchanged and the question open."""
    subject = question.subject or {}
    allowed = bool(choice.picked) and question.options[choice.picked[0]] == ALLOW
    if allowed:
        try:
            host, port = egress_target(subject.get("host"), subject.get("port"))
            rule = egress_rule(host, port)
            add_egress_rule(conn, question.chat_jid, rule, validate=parse_container_config)
        except ValueError as exc:  # ContainerConfigError is one
            raise BadInput(
                "option", f"cannot allow what this question names: {exc}; the group's network policy is unchanged"
            ) from None
        return f"🌐 {rule} is allowed for this group now (by {who} via {via}); the agent's next run may reach it."
    return f"🌐 {subject.get('host')}:{subject.get('port')} stays refused for this group (by {who} via {via})."


# -- expiring -------------------------------------------------------------------------------


def expire_in(conn: Connection, db: Database, question: Question, why: str) -> tuple[StoredMessage, int] | None:
    """Expire ``question`` in the caller's transaction: the agent is told why, nothing wakes."""
    subject = question.subject or {}
    said = (
        f"🌐 No answer about {subject.get('host')}:{subject.get('port')} ({why}): it stays refused."
        if question.answer_as == "egress"
        else f"No answer: the question expired ({why})."
    )
    new = _closing_message(
        question,
        content=said,
        sender=SENDER_SYSTEM,
        sender_name="system",
        extra={"expired": why},
        stamp=now_iso(),
        # Claude Code reads it with the next run's messages: the system's words, nobody's.
        message_type="system",
    )
    return _close(conn, db, question, new, state="expired", why=why, wake=False)


def expire_due(db: Database, now: datetime) -> list[Question]:
    """Expire the open questions whose time is up (the sweeper's); the ones expired."""
    expired: list[Question] = []
    for question in due_questions(db, now):
        hours = (question.expires_at - question.asked_at).total_seconds() / 3600
        with db.transaction() as conn:
            if expire_in(conn, db, question, f"no answer within {hours:g} h") is not None:
                expired.append(question)
    return expired


def choice_of(question: Question, options: Sequence[str], text: str | None) -> Choice:
    """The :class:`Choice` that ``options`` (each an option's text or number) and ``text``
    (free words) make; :class:`BadInput` naming an option the question does not have."""
    picked: list[int] = []
    for said in options:
        one = parse_choice(question.model_copy(update={"multiple": False}), said)
        if one is None:
            raise _no_option(question, said)
        picked.extend(i for i in one.picked if i not in picked)
    return Choice(tuple(picked), text)


def announce(
    answered: Answered, *, signal: Callable[[str], object] | None, signal_delivery: Callable[[str], object] | None
) -> None:
    """After the answer's commit: wake the group and its deliveries (a signal that cannot be
    sent is left to the sweeper: the pending mark and the deliveries are stored)."""
    jid = answered.question.chat_jid
    for send, what in ((signal, "a worker"), (signal_delivery if answered.queued else None, "a deliverer")):
        if send is None:
            continue
        try:
            send(jid)
        except Exception as exc:  # noqa: BLE001 - stored; the sweeper re-signals
            log.warning("could not signal %s for %s (%s); the sweeper will", what, jid, exc)
