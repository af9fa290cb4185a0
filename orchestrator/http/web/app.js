// The orchestrator's chat page: plain JavaScript, no build step, nothing
// loaded from elsewhere.  Every piece of text from the server goes into the
// page through textContent (never innerHTML), so a message can never become
// markup or script.
"use strict";

(() => {
  const TOKEN_KEY = "orchestrator.token";
  const NAME_KEY = "orchestrator.sender_name";
  const CONTEXT_LINES = 3;
  const MAX_DIFF_CELLS = 2_000_000;
  // Files (issue 31).  A message carries at most MAX_FILES (the API's limit).  Only these
  // raster types are ever shown in place: never SVG or HTML, whatever a message claims.
  const MAX_FILES = 20;
  const INLINE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
  // A preview is fetched whole into memory and decoded by the browser: past these, the
  // file is a download link only (a preview is not worth 25 MiB, nor a 40-megapixel decode).
  const PREVIEW_MAX_BYTES = 10 * 1024 * 1024;
  const PREVIEW_MAX_PIXELS = 40_000_000;
  const PREVIEW_BOX = 320;
  // Fetched previews, by file id (a file's bytes never change): a message shown again (the
  // stream's copy of one just sent, a reset after an edit) does not fetch them again.
  const PREVIEW_CACHE_BYTES = 32 * 1024 * 1024;

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    info: null,
    groups: [],
    current: null,      // the selected group
    stream: null,       // { close() }
    shown: new Map(),   // seq -> article element
    drafts: new Map(),  // run id -> {node, chars}: a reply being written (its length in code points), until it is stored
    run: null,
    pending: [],        // files chosen for the next message: { file, node }
    sending: false,
  };

  const $ = (id) => document.getElementById(id);

  // -- DOM helpers (text only) ------------------------------------------------

  const el = window.AgentDom.node; // dom.js

  function formatJson(value) {
    if (typeof value === "string") {
      try {
        return JSON.stringify(JSON.parse(value), null, 2);
      } catch {
        return value;
      }
    }
    return JSON.stringify(value, null, 2);
  }

  function shortTime(iso) {
    const d = new Date(iso);
    return isNaN(d) ? "" : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  // -- the API ----------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail, field) {
      super(field ? `${detail} (${field})` : detail);
      this.status = status;
      this.field = field;
    }
  }

  function authHeaders(extra) {
    // X-Orchestrator-Client: an API without a token refuses a change without it (a page of
    // another site cannot send it without a CORS preflight, which the API never grants).
    const headers = { Accept: "application/json", "X-Orchestrator-Client": "web", ...(extra || {}) };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    return headers;
  }

  // A JSON body, or a FormData one (an upload: the browser writes its multipart boundary).
  async function api(method, path, body) {
    const form = body instanceof FormData;
    const json = body !== undefined && !form;
    const init = { method, headers: authHeaders(json ? { "Content-Type": "application/json" } : {}) };
    if (body !== undefined) init.body = form ? body : JSON.stringify(body);
    const response = await fetch(`api/${path}`, init);
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (response.status === 401) {
      showLogin(state.token ? "That token was not accepted." : "");
    }
    if (!response.ok) throw apiError(response.status, data);
    return data;
  }

  function apiError(status, data) {
    const detail = data && typeof data.detail === "string" ? data.detail : `HTTP ${status}`;
    return new ApiError(status, detail, data && data.field);
  }

  // A stored file's bytes, with the token (an <img src> or a plain link could not send it).
  async function fetchFile(id, inline) {
    const response = await fetch(`api/files/${enc(id)}${inline ? "?inline=true" : ""}`, { headers: authHeaders({ Accept: "*/*" }) });
    if (response.status === 401) showLogin(state.token ? "That token was not accepted." : "");
    if (!response.ok) {
      let data = null;
      try {
        data = await response.json();
      } catch {
        data = null;
      }
      throw apiError(response.status, data);
    }
    return response;
  }

  const enc = encodeURIComponent;

  // -- login ----------------------------------------------------------------

  function showLogin(message) {
    if (state.stream) state.stream.close();
    state.stream = null;
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    $("app").hidden = true;
    $("login").hidden = false;
    $("login-error").hidden = !message;
    $("login-error").textContent = message || "";
    $("login-token").focus();
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("login-token").value.trim();
    $("login-token").value = "";
    if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
    start();
  });

  $("logout").addEventListener("click", () => showLogin(""));

  // -- errors -------------------------------------------------------------------

  let errorTimer = null;
  function showError(error) {
    const bar = $("error");
    bar.textContent = error instanceof Error ? error.message : String(error);
    bar.hidden = false;
    clearTimeout(errorTimer);
    errorTimer = setTimeout(() => { bar.hidden = true; }, 10000);
  }

  // -- groups -------------------------------------------------------------------

  function assistantName() {
    return (state.current && state.current.assistant_name) || (state.info && state.info.assistant_name) || "Assistant";
  }

  function renderGroups() {
    const list = $("groups");
    list.replaceChildren();
    for (const g of state.groups) {
      const badges = [];
      if (g.is_main) badges.push(el("span", { className: "badge", text: "main" }));
      else if (g.requires_trigger) badges.push(el("span", { className: "badge", text: `@${g.assistant_name || state.info.assistant_name}` }));
      const button = el(
        "button",
        { type: "button", className: "group", dataset: { jid: g.chat_jid }, onclick: () => selectGroup(g.chat_jid) },
        el("span", { className: "group-name", text: g.name }),
        badges,
        el("span", { className: "group-jid", text: g.chat_jid }),
      );
      if (state.current && state.current.chat_jid === g.chat_jid) button.classList.add("active");
      list.append(el("li", {}, button));
    }
    if (!state.groups.length) {
      list.append(el("li", { className: "muted", text: "No groups yet: POST /api/groups or `orchestrator groups add`." }));
    }
  }

  // `#chat_jid=<jid>` names the chat to show; `#chat=<jid>`, the older
  // spelling, still opens it (and is rewritten to the new one).
  function wantedJid() {
    const match = /^#chat(?:_jid)?=(.+)$/.exec(location.hash);
    return match ? decodeURIComponent(match[1]) : null;
  }

  function selectGroup(jid) {
    const group = state.groups.find((g) => g.chat_jid === jid);
    if (!group) return;
    if (state.current && state.current.chat_jid === jid && state.stream) return;
    state.current = group;
    const hash = `#chat_jid=${enc(jid)}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
    renderGroups();
    $("chat-title").textContent = group.name;
    $("chat-jid").textContent = group.chat_jid;
    const text = $("composer-text");
    text.disabled = false;
    $("send").disabled = state.sending;
    $("attach").disabled = false;
    const trigger = group.requires_trigger && !group.is_main;
    text.placeholder = trigger ? `Message (start with @${assistantName()} to wake the agent)` : `Message ${assistantName()}`;
    $("composer-note").textContent = "";
    setRun(null);
    clearMessages();
    window.GroupProfile.select(group.chat_jid, api); // the group's profile panel (profile.js)
    openStream(group.chat_jid);
    text.focus();
  }

  // -- the live stream ------------------------------------------------------

  function openStream(jid) {
    if (state.stream) state.stream.close();
    // drafts=append: each draft event carries what the reply grew by, not the whole text.
    const url = `api/chats/${enc(jid)}/stream?after=0&drafts=append`;
    const handlers = {
      message: (data) => showMessage(JSON.parse(data)),
      run: (data) => setRun(JSON.parse(data)),
      reset: () => clearMessages(),
      draft: (data) => showDraft(JSON.parse(data)),
      reaction: (data) => window.AgentReactions.add(JSON.parse(data), state.shown),
      open: () => setConn("live", "● live"),
      error: () => setConn("down", "reconnecting…"),
    };
    // EventSource cannot send an Authorization header (and a token in the URL
    // would end up in access logs), so with a token the same stream is read
    // with fetch.
    state.stream = state.token ? fetchEventStream(url, handlers) : eventSource(url, handlers);
  }

  function eventSource(url, handlers) {
    const source = new EventSource(url);
    for (const name of ["message", "run", "reset", "draft", "reaction"]) {
      source.addEventListener(name, (event) => handlers[name](event.data));
    }
    source.onopen = handlers.open;
    source.onerror = () => {
      handlers.error();
      if (source.readyState === EventSource.CLOSED) showError("The live stream closed; reload the page.");
    };
    return { close: () => source.close() };
  }

  function fetchEventStream(url, handlers) {
    const controller = new AbortController();
    let stopped = false;
    let lastId = null;
    let retryMs = 2000;

    function dispatch(block) {
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
        else if (field === "id") lastId = value;
        else if (field === "retry" && /^\d+$/.test(value)) retryMs = Number(value);
      }
      if (data.length && handlers[event]) handlers[event](data.join("\n"));
    }

    async function run() {
      while (!stopped) {
        try {
          const headers = authHeaders({ Accept: "text/event-stream" });
          if (lastId !== null) headers["Last-Event-ID"] = lastId;
          const response = await fetch(url, { headers, signal: controller.signal, cache: "no-store" });
          if (response.status === 401) {
            showLogin("That token was not accepted.");
            return;
          }
          if (!response.ok) throw new Error(`HTTP ${response.status}`);
          handlers.open();
          const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
          let buffer = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buffer += value.replace(/\r\n?/g, "\n");
            let end;
            while ((end = buffer.indexOf("\n\n")) >= 0) {
              dispatch(buffer.slice(0, end));
              buffer = buffer.slice(end + 2);
            }
          }
        } catch (error) {
          if (stopped) return;
        }
        handlers.error();
        await new Promise((resolve) => setTimeout(resolve, retryMs));
      }
    }

    run();
    return { close: () => { stopped = true; controller.abort(); } };
  }

  function setConn(kind, text) {
    const conn = $("conn");
    conn.textContent = text;
    conn.dataset.state = kind;
  }

  // -- run status -----------------------------------------------------------

  const RUN_LABELS = {
    queued: "queued",
    running: "running",
    succeeded: "done",
    failed: "failed",
    timed_out: "failed (timed out)",
    cancelled: "failed (cancelled)",
  };

  function setRun(run) {
    state.run = run;
    const pill = $("run-status");
    if (!run) {
      pill.hidden = true;
      pill.textContent = "";
      delete pill.dataset.state;
    } else {
      const label = RUN_LABELS[run.state] || run.state;
      const attempt = run.attempts > 1 && (run.state === "queued" || run.state === "running") ? ` · attempt ${run.attempts}` : "";
      pill.hidden = false;
      pill.dataset.state = run.state;
      pill.textContent = `${run.state === "running" || run.state === "queued" ? "⏳ " : ""}${label}${attempt}`;
      pill.title = run.error || `run ${run.id}`;
    }
    const busy = run && (run.state === "queued" || run.state === "running");
    let typing = document.querySelector("#messages .typing");
    if (busy && !typing) {
      typing = el("div", { className: "typing" }, el("span", { className: "dots", text: "•••" }), ` ${assistantName()} is working`);
      $("messages").append(typing);
      scrollDown(true);
    } else if (!busy && typing) {
      typing.remove();
    }
    if (run && !busy) removeDraft(run.id);
  }

  // -- messages -------------------------------------------------------------

  function clearMessages() {
    state.shown.clear();
    window.AgentReactions.clear();
    state.drafts.clear();
    $("messages").replaceChildren();
    if (state.run) setRun(state.run);
  }

  function nearBottom() {
    const box = $("messages");
    return box.scrollHeight - box.scrollTop - box.clientHeight < 120;
  }

  function scrollDown(force) {
    const box = $("messages");
    if (force || nearBottom()) box.scrollTop = box.scrollHeight;
  }

  // A reply as the model writes it (the stream's "draft" events): plain text, replaced by
  // the stored message when it arrives (or dropped when the run ends).  Each event says
  // to keep the first `offset` characters (code points) shown and put `text` after them:
  // offset 0 starts the draft over, and with no text the draft is gone.
  function showDraft(draft) {
    if (!draft.offset && !draft.text) {
      removeDraft(draft.run_id);
      return;
    }
    const stick = nearBottom();
    let shown = state.drafts.get(draft.run_id);
    if (!shown) {
      if (draft.offset) return;  // the stream never continues a draft it did not start on this page
      const node = el("article", { className: "msg msg-assistant msg-draft", dataset: { run: draft.run_id } },
        el("header", { className: "msg-head" }, el("span", { className: "who", text: assistantName() }),
          el("span", { className: "muted", text: "writing…" })),
        el("div", { className: "text" }));
      const box = $("messages");
      const typing = box.querySelector(".typing");
      if (typing) box.insertBefore(node, typing);
      else box.append(node);
      shown = { node, chars: 0 };
      state.drafts.set(draft.run_id, shown);
    }
    const text = shown.node.querySelector(".text");
    const offset = draft.offset || 0;
    if (offset === shown.chars && offset > 0) {
      text.append(draft.text);  // what it grew by: a text node more, nothing rewritten
    } else {
      const kept = offset > 0 ? Array.from(text.textContent).slice(0, offset).join("") : "";
      text.textContent = kept + draft.text;
    }
    shown.chars = Math.min(offset, shown.chars) + Array.from(draft.text).length;
    if (stick) scrollDown(true);
  }

  function removeDraft(runId) {
    const shown = state.drafts.get(runId);
    if (shown) shown.node.remove();
    state.drafts.delete(runId);
  }

  const rendered = new WeakMap(); // article -> the message it shows, as JSON

  function showMessage(message) {
    // The stored reply takes the place of its run's draft.
    const runId = message.metadata && message.metadata.run_id;
    if (runId && message.sender === "bot") removeDraft(runId);
    // What closes a question (its answer, its expiry): the question's buttons are greyed out.
    if (message.metadata && message.metadata.question_id) window.AgentQuestions.refresh(message.chat_jid, api);
    const old = state.shown.get(message.seq);
    // The same message again (the stream's copy of one this page just sent): kept as it is
    // shown, its previews not fetched a second time.
    const seen = JSON.stringify(message);
    if (old && rendered.get(old) === seen) return;
    const stick = nearBottom();
    const node = renderMessage(message);
    window.AgentReactions.decorate(message.seq, node);
    rendered.set(node, seen);
    const box = $("messages");
    if (old) {
      old.replaceWith(node);
    } else {
      // Stream order is seq order; keep it even if something arrives late.
      const later = [...state.shown.keys()].filter((s) => s > message.seq).sort((a, b) => a - b)[0];
      // Stored messages go above the drafts and the "working" line.
      const live = box.querySelector(".msg-draft") || box.querySelector(".typing");
      if (later !== undefined) box.insertBefore(node, state.shown.get(later));
      else if (live) box.insertBefore(node, live);
      else box.append(node);
    }
    state.shown.set(message.seq, node);
    if (stick) scrollDown(true);
  }

  function removeMessages(seqs) {
    for (const seq of seqs) {
      const node = state.shown.get(seq);
      if (node) node.remove();
      state.shown.delete(seq);
    }
  }

  function envelopeOf(metadata) {
    if (!metadata || typeof metadata !== "object" || typeof metadata.message_type !== "string") return null;
    return metadata;
  }

  function kindOf(m) {
    if (m.message_type === "host") return "host";
    if (m.sender === "egress_log") return "egress";
    if (m.message_type === "system") return "system";
    if (m.message_type === "tool_result") return "tool";
    if (m.message_type === "assistant") {
      if (m.sender === "tool_use") return "tool-use";
      if (m.sender === "thinking") return "thinking";
      if (m.sender === "result_meta") return "result";
      if (m.sender === "bot") return "assistant";
      return "meta";
    }
    return "user";
  }

  function renderMessage(m) {
    const kind = kindOf(m);
    const meta = m.metadata || {};
    const article = el("article", {
      className: `msg msg-${kind}`,
      dataset: { seq: m.seq, id: m.id, type: m.message_type, sender: m.sender },
    });
    const who = {
      host: "🏠 host",
      system: "⚙️ system",
      tool: `🔧 ${meta.tool || m.sender_name || "tool"}`,
      "tool-use": `🛠️ ${m.sender_name || "tool"}`,
      thinking: `💭 ${m.sender_name || assistantName()}`,
      result: "📊 run",
      egress: "🌐 network",
      assistant: m.sender_name || assistantName(),
      meta: m.sender_name || m.sender,
      user: m.sender_name || m.sender,
    }[kind];
    const head = el("header", { className: "msg-head" }, el("span", { className: "who", text: who }));
    if (kind === "tool") head.append(exitBadge(meta.exit_code));
    if (m.edited_at) head.append(el("span", { className: "edited muted", text: "(edited)", title: `edited ${m.edited_at}` }));
    head.append(el("time", { className: "muted", datetime: m.timestamp, text: shortTime(m.timestamp), title: `#${m.seq} ${m.timestamp}` }));
    article.append(head, renderBody(m, kind));

    const actions = el("div", { className: "actions" });
    if (kind === "user" && !m.is_from_me) {
      actions.append(el("button", { type: "button", className: "link edit", text: "Edit", onclick: () => startEdit(m, article) }));
    }
    if (kind === "assistant") {
      actions.append(el("button", { type: "button", className: "link regenerate", text: "Regenerate", onclick: () => regenerate(m) }));
    }
    if (actions.childElementCount) article.append(actions);
    return article;
  }

  function exitBadge(code) {
    const ok = code === 0;
    return el("span", {
      className: `exit ${ok ? "ok" : "fail"}`,
      dataset: { exitCode: code === undefined || code === null ? "" : code },
      text: `${ok ? "✅" : "❌"} exit ${code === undefined || code === null ? "?" : code}`,
    });
  }

  function textBlock(text, className) {
    return el("div", { className: className || "text", text });
  }

  // Text with ``` fenced blocks shown as code (still text nodes only).
  function richText(text) {
    const block = el("div", { className: "text" });
    const parts = (text || "").split(/^```[^\n]*$/m);
    parts.forEach((part, i) => {
      if (i % 2 === 1 && i < parts.length - 1) {
        block.append(el("pre", { className: "fenced", text: part.replace(/^\n/, "").replace(/\n$/, "") }));
        return;
      }
      let plain = part;
      if (i > 0) plain = plain.replace(/^\n+/, "");
      if (i < parts.length - 1) plain = plain.replace(/\n+$/, "");
      if (plain) block.append(plain);
    });
    return block;
  }

  function renderBody(m, kind) {
    const env = envelopeOf(m.metadata);
    const body = el("div", { className: "msg-body" });
    const type = env && env.message_type;
    if (type === "CODE_EDIT" && env.payload && Array.isArray(env.payload.edits)) {
      if (kind !== "tool" && m.content) body.append(textBlock(m.content, "caption"));
      for (const edit of env.payload.edits) body.append(renderCodeEdit(edit));
      return body;
    }
    if (type === "TODO" && env.payload && Array.isArray(env.payload.todos)) {
      body.append(renderTodos(env.payload.todos));
      return body;
    }
    if (type === "TOOL_CALL" && env.payload && typeof env.payload.tool_name === "string") {
      body.append(renderToolCall(env.payload, m));
      return body;
    }
    if (kind === "tool") {
      const lines = (m.content || "").split("\n").length;
      const pre = el("pre", { className: "output", text: m.content || "(no output)" });
      body.append(lines > 12 ? el("details", {}, el("summary", { text: `output (${lines} lines)` }), pre) : pre);
      return body;
    }
    if (kind === "thinking") {
      body.append(el("details", {}, el("summary", { text: "thinking" }), textBlock(m.content)));
      return body;
    }
    if (kind === "egress") {
      body.append(window.RunEgress.render(m, api)); // the run's egress log (egress.js)
      return body;
    }
    if (kind === "result") {
      // The run's record (model, stop reason, tokens, time, cost estimate): one muted line.
      body.append(textBlock(m.content, "result-line"));
      return body;
    }
    if (type === "APPROVAL") {
      // The agent's question: its options as buttons (questions.js).
      const asked = window.AgentQuestions.render(env.payload, m.chat_jid, api);
      if (asked) {
        body.append(asked);
        return body;
      }
    }
    const files = type === "FILE" && env.payload && Array.isArray(env.payload.files) ? env.payload.files : null;
    if (m.content || !files) body.append(kind === "assistant" ? richText(m.content) : textBlock(m.content));
    if (files) {
      body.append(renderFiles(files));
      return body;
    }
    if (type && type !== "TEXT" && !["CODE_EDIT", "TODO", "TOOL_CALL"].includes(type)) {
      body.append(el("details", {}, el("summary", { text: `${type} message` }), el("pre", { className: "json", text: formatJson(env.payload) })));
    }
    return body;
  }

  // -- FILE: previews and downloads ---------------------------------------------------
  // A file's name, type and size come from the message: shown as text, never trusted to
  // decide what runs.  An image is shown only when the server's own Content-Type (sniffed
  // from the bytes) is one of INLINE_TYPES, as a blob: URL made from those bytes.

  function humanSize(n) {
    let size = Number(n);
    if (!Number.isFinite(size) || size < 0) return "";
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (size < 1024) return unit === "B" ? `${Math.round(size)} B` : `${size.toFixed(1)} ${unit}`;
      size /= 1024;
    }
    return `${size.toFixed(1)} TiB`;
  }

  function dimension(value) {
    return Number.isInteger(value) && value > 0 ? value : null;
  }

  function renderFiles(files) {
    const list = el("ul", { className: "files" });
    for (const f of files.slice(0, MAX_FILES)) {
      if (!f || typeof f !== "object" || typeof f.id !== "string" || !f.id) continue;
      const name = typeof f.name === "string" && f.name ? f.name : "file";
      const mime = typeof f.mime === "string" ? f.mime : "";
      const item = el("li", { className: "file", dataset: { fileId: f.id, mime } });
      const width = dimension(f.width);
      const height = dimension(f.height);
      const small = Number(f.size) <= PREVIEW_MAX_BYTES && (!width || !height || width * height <= PREVIEW_MAX_PIXELS);
      if (INLINE_TYPES.has(mime) && small) item.append(renderPreview(f.id, name, width, height));
      const link = el(
        "a", { className: "file-download", href: `api/files/${enc(f.id)}`, download: name, title: `Download ${name}` },
        el("span", { className: "file-icon", text: "📎", "aria-hidden": "true" }),
        el("span", { className: "file-name", text: name }),
        el("span", { className: "file-size muted", text: humanSize(f.size) }),
      );
      link.addEventListener("click", (event) => {
        event.preventDefault();
        downloadFile(f.id, name, link);
      });
      item.append(link);
      list.append(item);
    }
    return list;
  }

  function renderPreview(id, name, width, height) {
    const img = el("img", { className: "file-image", alt: name, decoding: "async", dataset: { fileId: id } });
    if (width && height) {
      // The box it will take, reserved before the bytes arrive (the list does not jump).
      const scale = Math.min(1, PREVIEW_BOX / width, PREVIEW_BOX / height);
      img.width = Math.max(1, Math.round(width * scale));
      img.height = Math.max(1, Math.round(height * scale));
    }
    const box = el("div", { className: "file-preview", dataset: { state: "waiting" } }, img);
    if (width && height) {
      box.style.width = `${img.width}px`;
      box.style.height = `${img.height}px`;
    }
    previewObserver.observe(box);
    return box;
  }

  // Previews are fetched when they come near the visible part of the list, not all at once.
  const previewObserver = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      previewObserver.unobserve(entry.target);
      if (entry.target.isConnected) loadPreview(entry.target);
    }
  }, { root: $("messages"), rootMargin: "400px 0px" });

  const previewCache = new Map(); // file id -> { blob: Promise<Blob>, bytes }, oldest first

  function previewBlob(id) {
    const hit = previewCache.get(id);
    if (hit) {
      previewCache.delete(id);
      previewCache.set(id, hit); // the newest again
      return hit.blob;
    }
    const entry = { blob: fetchPreview(id), bytes: 0 };
    previewCache.set(id, entry);
    entry.blob.then(
      (blob) => {
        entry.bytes = blob.size;
        trimPreviewCache();
      },
      () => {
        if (previewCache.get(id) === entry) previewCache.delete(id); // a later showing tries again
      },
    );
    return entry.blob;
  }

  function trimPreviewCache() {
    let total = 0;
    for (const entry of previewCache.values()) total += entry.bytes;
    for (const [id, entry] of previewCache) {
      if (total <= PREVIEW_CACHE_BYTES || previewCache.size <= 1) break;
      previewCache.delete(id);
      total -= entry.bytes;
    }
  }

  async function fetchPreview(id) {
    const response = await fetchFile(id, true);
    const type = (response.headers.get("Content-Type") || "").split(";")[0].trim().toLowerCase();
    if (!INLINE_TYPES.has(type)) {
      response.body.cancel();
      throw new Error(`not an image to show (${type || "no type"})`);
    }
    const bytes = await readAtMost(response, PREVIEW_MAX_BYTES);
    return new Blob(bytes, { type });
  }

  // The response's body, refused past `limit` bytes (whatever its Content-Length said).
  async function readAtMost(response, limit) {
    const reader = response.body.getReader();
    const chunks = [];
    let total = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return chunks;
      total += value.byteLength;
      if (total > limit) {
        reader.cancel();
        throw new Error(`larger than ${humanSize(limit)}`);
      }
      chunks.push(value);
    }
  }

  async function loadPreview(box) {
    const img = box.querySelector("img");
    box.dataset.state = "loading";
    let url = null;
    try {
      const blob = await previewBlob(img.dataset.fileId);
      if (!box.isConnected) return; // gone meanwhile (the chat changed, a reset)
      const stick = nearBottom();
      url = URL.createObjectURL(blob);
      await new Promise((resolve, reject) => {
        img.addEventListener("load", resolve, { once: true });
        img.addEventListener("error", () => reject(new Error("the image could not be decoded")), { once: true });
        img.src = url;
      });
      box.dataset.state = "shown";
      box.style.removeProperty("width");
      box.style.removeProperty("height");
      if (stick) scrollDown(true);
    } catch (error) {
      box.dataset.state = "failed";
      box.title = `No preview: ${error.message}`;
      img.removeAttribute("src");
    } finally {
      // The <img> keeps the decoded picture; the URL is not needed once it has loaded.
      if (url) URL.revokeObjectURL(url);
    }
  }

  // A download with the token: the bytes fetched, then saved through a blob: URL under the
  // file's name (typed application/octet-stream, so the browser saves it and shows nothing).
  async function downloadFile(id, name, link) {
    if (link.getAttribute("aria-busy") === "true") return;
    link.setAttribute("aria-busy", "true");
    try {
      const response = await fetchFile(id, false);
      const blob = await response.blob();
      const url = URL.createObjectURL(new Blob([blob], { type: "application/octet-stream" }));
      const save = el("a", { href: url, download: name, hidden: true });
      document.body.append(save);
      save.click();
      save.remove();
      // The download has started from the URL well before this.
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (error) {
      showError(`${name} could not be downloaded: ${error.message}`);
    } finally {
      link.removeAttribute("aria-busy");
    }
  }

  // -- CODE_EDIT: a line diff with the file path ------------------------------------

  function splitLines(text) {
    if (text === null || text === undefined || text === "") return [];
    const lines = text.split("\n");
    if (lines[lines.length - 1] === "") lines.pop();
    return lines;
  }

  function diffLines(a, b) {
    // Common prefix and suffix first; an LCS table for the middle when small enough.
    let start = 0;
    while (start < a.length && start < b.length && a[start] === b[start]) start++;
    let endA = a.length;
    let endB = b.length;
    while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA--; endB--; }
    const ops = a.slice(0, start).map((t) => ["ctx", t]);
    const midA = a.slice(start, endA);
    const midB = b.slice(start, endB);
    const n = midA.length;
    const m = midB.length;
    if (n && m && n * m <= MAX_DIFF_CELLS) {
      const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
      for (let i = n - 1; i >= 0; i--) {
        for (let j = m - 1; j >= 0; j--) {
          lcs[i][j] = midA[i] === midB[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
        }
      }
      let i = 0;
      let j = 0;
      while (i < n && j < m) {
        if (midA[i] === midB[j]) { ops.push(["ctx", midA[i]]); i++; j++; }
        else if (lcs[i + 1][j] >= lcs[i][j + 1]) ops.push(["del", midA[i++]]);
        else ops.push(["add", midB[j++]]);
      }
      while (i < n) ops.push(["del", midA[i++]]);
      while (j < m) ops.push(["add", midB[j++]]);
    } else {
      for (const t of midA) ops.push(["del", t]);
      for (const t of midB) ops.push(["add", t]);
    }
    for (const t of a.slice(endA)) ops.push(["ctx", t]);
    return ops;
  }

  function renderCodeEdit(edit) {
    const created = edit.old_content === null && edit.new_content !== null;
    const deleted = edit.new_content === null && edit.old_content !== null;
    const ops = diffLines(splitLines(edit.old_content), splitLines(edit.new_content));
    const added = ops.filter((o) => o[0] === "add").length;
    const removed = ops.filter((o) => o[0] === "del").length;
    const head = el(
      "div", { className: "file-head" },
      el("span", { className: "verb", text: created ? "Created" : deleted ? "Deleted" : "Edited" }),
      el("code", { className: "path", text: edit.file_path }),
      edit.language ? el("span", { className: "lang muted", text: edit.language }) : null,
      el("span", { className: "stat" }, el("span", { className: "plus", text: `+${added}` }), " ", el("span", { className: "minus", text: `−${removed}` })),
    );
    const diff = el("div", { className: "diff" });
    const changed = ops.map((o) => o[0] !== "ctx");
    const keep = ops.map((_, i) => {
      for (let k = Math.max(0, i - CONTEXT_LINES); k <= Math.min(ops.length - 1, i + CONTEXT_LINES); k++) if (changed[k]) return true;
      return false;
    });
    // A gap of one line is shown, not replaced by a marker of the same height.
    for (let i = 0; i < keep.length; i++) {
      if (!keep[i] && (i === 0 || keep[i - 1]) && (i === keep.length - 1 || keep[i + 1])) keep[i] = true;
    }
    let skipped = 0;
    const flushSkip = () => {
      if (skipped) diff.append(el("div", { className: "line skip", text: `⋯ ${skipped} unchanged line${skipped === 1 ? "" : "s"}` }));
      skipped = 0;
    };
    ops.forEach(([op, text], i) => {
      if (!keep[i]) { skipped++; return; }
      flushSkip();
      const sign = op === "add" ? "+" : op === "del" ? "-" : " ";
      diff.append(el("div", { className: `line ${op}` }, el("span", { className: "sign", text: sign }), el("span", { className: "code", text })));
    });
    flushSkip();
    if (!ops.length) diff.append(el("div", { className: "line skip", text: "(empty file)" }));
    return el("div", { className: "code-edit" }, head, diff);
  }

  // -- TODO: a checklist ----------------------------------------------------------

  const TODO_MARKS = { pending: "○", in_progress: "◐", completed: "●" };

  function renderTodos(todos) {
    const done = todos.filter((t) => t.status === "completed").length;
    const list = el("ul", { className: "todo" });
    for (const t of todos) {
      list.append(el(
        "li", { className: `todo-item ${t.status}`, dataset: { status: t.status } },
        el("span", { className: "mark", text: TODO_MARKS[t.status] || "○", "aria-label": t.status }),
        el("span", { className: "todo-text", text: t.content }),
      ));
    }
    return el("div", { className: "todos" }, el("div", { className: "todo-head muted", text: `Todos ${done}/${todos.length} done` }), list);
  }

  // -- TOOL_CALL: collapsible input / output ----------------------------------------

  function renderToolCall(payload, m) {
    const failed = Boolean(payload.error);
    const summary = el(
      "summary", {},
      el("span", { className: "tool-name", text: payload.tool_name }),
      failed ? el("span", { className: "tool-error-mark", text: ` ❌ ${payload.error.split("\n")[0].slice(0, 80)}` }) : null,
    );
    const details = el("details", { className: `tool-call${failed ? " error" : ""}` }, summary);
    details.append(el("div", { className: "label", text: "input" }), el("pre", { className: "json tool-input", text: formatJson(payload.input || {}) }));
    const output = payload.output === null || payload.output === undefined ? m.content : payload.output;
    if (output !== null && output !== undefined && output !== "") {
      details.append(el("div", { className: "label", text: "output" }), el("pre", { className: "json tool-output", text: formatJson(output) }));
    }
    if (failed) details.append(el("div", { className: "label", text: "error" }), el("pre", { className: "tool-error", text: payload.error }));
    return details;
  }

  // -- edit and regenerate ------------------------------------------------------------

  function startEdit(m, article) {
    const body = article.querySelector(".msg-body");
    const box = el("textarea", { className: "edit-text", rows: 3 });
    box.value = m.content;
    const done = () => { form.replaceWith(body); };
    const send = async (rerun) => {
      try {
        const change = await api("POST", `chats/${enc(m.chat_jid)}/messages/${enc(m.id)}/edit`, { content: box.value, rerun });
        removeMessages(change.superseded);
        showMessage(change.message);
      } catch (error) {
        showError(error);
        done();
      }
    };
    const form = el(
      "div", { className: "edit-form" }, box,
      el("div", { className: "edit-buttons" },
        el("button", { type: "button", className: "save", text: "Save", onclick: () => send(false) }),
        el("button", { type: "button", className: "save-rerun", text: "Save and ask again", onclick: () => send(true) }),
        el("button", { type: "button", className: "link", text: "Cancel", onclick: done }),
      ),
    );
    body.replaceWith(form);
    box.focus();
  }

  async function regenerate(m) {
    try {
      const change = await api("POST", `chats/${enc(m.chat_jid)}/messages/${enc(m.id)}/regenerate`);
      removeMessages(change.superseded);
    } catch (error) {
      showError(error);
    }
  }

  // -- composer ---------------------------------------------------------------------

  const nameBox = $("sender-name");
  nameBox.value = localStorage.getItem(NAME_KEY) || "web";
  nameBox.addEventListener("change", () => localStorage.setItem(NAME_KEY, nameBox.value.trim() || "web"));

  // Files chosen for the next message: the paperclip (a hidden <input type=file>) or a drop
  // onto the composer.  Each is listed (name, size, ×; a thumbnail for a raster image) until
  // the message is sent; a refused send keeps them, and the text.

  function addFiles(list) {
    // A file past the server's per-file limit is said at once, not after its upload.
    const limit = state.info && state.info.file_max_bytes;
    const all = Array.from(list || []);
    const files = limit ? all.filter((f) => f.size <= limit) : all;
    if (files.length < all.length) {
      const big = all.filter((f) => !files.includes(f)).map((f) => f.name);
      showError(`Not added: ${big.join(", ")} (a file may be at most ${humanSize(limit)}).`);
    }
    const room = Math.max(0, MAX_FILES - state.pending.length);
    if (files.length > room) showError(`A message carries at most ${MAX_FILES} files: ${files.length - room} not added.`);
    for (const file of files.slice(0, room)) state.pending.push({ file, node: pendingNode(file) });
    renderPending();
  }

  function pendingNode(file) {
    const entry = el("li", { className: "pending-file", title: `${file.name} (${humanSize(file.size)})` });
    // The sender's own file, in this browser: shown only as one of the raster types.
    if (INLINE_TYPES.has(file.type) && file.size <= PREVIEW_MAX_BYTES) {
      const url = URL.createObjectURL(file);
      const thumb = el("img", { className: "pending-thumb", alt: "" });
      const done = () => URL.revokeObjectURL(url);
      thumb.addEventListener("load", done, { once: true });
      thumb.addEventListener("error", () => { done(); thumb.remove(); }, { once: true });
      thumb.src = url;
      entry.append(thumb);
    }
    entry.append(
      el("span", { className: "file-name", text: file.name }),
      el("span", { className: "file-size muted", text: humanSize(file.size) }),
      el("button", {
        type: "button", className: "remove", text: "×", title: `Remove ${file.name}`, "aria-label": `Remove ${file.name}`,
        onclick: () => {
          state.pending = state.pending.filter((p) => p.file !== file);
          renderPending();
          $("composer-text").focus();
        },
      }),
    );
    return entry;
  }

  function renderPending() {
    const list = $("attachments");
    list.replaceChildren(...state.pending.map((p) => p.node));
    list.hidden = !state.pending.length;
  }

  $("attach").addEventListener("click", () => $("file-input").click());
  $("file-input").addEventListener("change", (event) => {
    addFiles(event.target.files);
    event.target.value = ""; // the same file may be chosen again later
  });

  const composer = $("composer");
  const carriesFiles = (event) => Boolean(event.dataTransfer) && Array.from(event.dataTransfer.types || []).includes("Files");
  for (const name of ["dragenter", "dragover"]) {
    composer.addEventListener(name, (event) => {
      if (!carriesFiles(event) || !state.current) return;
      event.preventDefault(); // this element takes the drop
      event.dataTransfer.dropEffect = "copy";
      composer.classList.add("dropping");
    });
  }
  composer.addEventListener("dragleave", (event) => {
    if (!composer.contains(event.relatedTarget)) composer.classList.remove("dropping");
  });
  composer.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    composer.classList.remove("dropping");
    if (state.current) addFiles(event.dataTransfer.files);
    $("composer-text").focus();
  });
  // A file dropped anywhere else would make the browser open it in place of the page (and
  // lose what was typed): refused there.
  for (const name of ["dragover", "drop"]) {
    window.addEventListener(name, (event) => {
      if (!carriesFiles(event) || composer.contains(event.target)) return;
      event.preventDefault();
      event.dataTransfer.dropEffect = "none";
    });
  }

  function fileEnvelope(stored) {
    const files = stored.map((f) => ({ id: f.id, name: f.name, mime: f.mime, size: f.size }));
    return { message_type: "FILE", version: 1, payload: { files } };
  }

  function setSending(sending) {
    state.sending = sending;
    $("send").disabled = sending || !state.current;
    composer.classList.toggle("sending", sending);
  }

  composer.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = $("composer-text");
    const content = text.value;
    const chosen = state.pending.slice();
    if (state.sending || !state.current || (!content.trim() && !chosen.length)) return;
    const jid = state.current.chat_jid;
    const name = nameBox.value.trim() || "web";
    const note = $("composer-note");
    setSending(true);
    note.classList.remove("refused");
    note.textContent = ""; // what it said of the previous message
    try {
      const message = { chat_jid: jid, sender: `web:${name}`, sender_name: name, content };
      if (chosen.length) {
        const total = chosen.reduce((sum, p) => sum + p.file.size, 0);
        note.textContent = `Sending ${chosen.length} file${chosen.length === 1 ? "" : "s"} (${humanSize(total)})…`;
        const form = new FormData();
        for (const p of chosen) form.append("file", p.file, p.file.name);
        message.metadata = fileEnvelope(await api("POST", `chats/${enc(jid)}/files`, form));
      }
      const posted = await api("POST", "messages", message);
      text.value = "";
      state.pending = state.pending.filter((p) => !chosen.includes(p));
      renderPending();
      if (state.current && state.current.chat_jid === jid) showMessage(posted.message);
      note.textContent = posted.triggered
        ? ""
        : `Stored; it does not wake the agent (start a message with @${assistantName()}).`;
    } catch (error) {
      showError(error);
      // Nothing is lost: the text and the files stay in the composer for another try.
      note.textContent = `Not sent: ${error.message}`;
      note.classList.add("refused");
    } finally {
      setSending(false);
      text.focus();
    }
  });

  $("composer-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });

  window.addEventListener("hashchange", () => {
    const jid = wantedJid();
    if (jid) selectGroup(jid);
  });

  // -- start ------------------------------------------------------------------------

  async function start() {
    try {
      state.info = await api("GET", "info");
      state.groups = await api("GET", "groups");
    } catch (error) {
      if (error.status !== 401) {
        $("app").hidden = false;
        showError(error);
      }
      return;
    }
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = !state.token;
    renderGroups();
    const jid = wantedJid();
    const first = state.groups.find((g) => g.chat_jid === jid) || state.groups[0];
    if (first) selectGroup(first.chat_jid);
  }

  start();
})();
