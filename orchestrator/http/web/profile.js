// The selected group's profile on the chat page (issue 32): what its runs get (model, max
// tokens, thinking budget, the names that wake it, its optional tools, its quotas), whose
// each value is (the group's own or the installation's), its scheduled tasks, and a form that
// changes them.  GET /api/groups/{chat} reads it (the group as stored, `in_effect`, and
// `installation`: what a null field gives); PATCH /api/groups/{chat} changes the fields that
// differ from what is stored, an empty field sending null (back to the installation's).  A
// refusal (400) is shown under the field it names and the form keeps what was typed; the
// change's 🏠 message reaches the chat through the stream like any other.  A host message
// arriving while the panel is open (a change made elsewhere says so in the chat) reads the
// profile again; the form is refilled only when nothing in it was typed.  Everything from the
// server goes in through textContent only, as in app.js.  app.js calls select().
"use strict";

window.GroupProfile = (() => {
  const enc = encodeURIComponent;
  // The fields the form changes, in the order it shows them.  kind: how the box reads.
  const FIELDS = [
    { key: "model", label: "Model", kind: "text", hint: "provider:model: offline, anthropic:…, openai:…, claude-code:…" },
    { key: "max_tokens", label: "Max tokens", kind: "whole", hint: "of one model answer" },
    { key: "thinking_budget", label: "Thinking budget", kind: "whole", hint: "0: off; else ≥ 1,024 and below max tokens" },
    { key: "trigger_names", label: "Trigger names", kind: "names", hint: "@Name wakes the group; these replace the installation's" },
    { key: "tools", label: "Tools", kind: "tools" },
    { key: "runs_per_hour", label: "Runs per hour", kind: "whole", hint: "0: no limit" },
    { key: "tokens_per_day", label: "Tokens per day", kind: "whole", hint: "per UTC day; 0: no limit" },
  ];

  const panel = { jid: null, api: null, profile: null, dirty: false, refill: false, saving: false, loading: 0, observer: null };

  const $ = (id) => document.getElementById(id);

  const node = window.AgentDom.node; // dom.js

  // -- how values read ----------------------------------------------------------------

  const number = (n) => Number(n).toLocaleString("en-US");

  function shown(key, value) {
    if (value === null || value === undefined) return "";
    if (key === "thinking_budget") return value ? number(value) : "off";
    if (key === "runs_per_hour" || key === "tokens_per_day") return value ? number(value) : "no limit";
    if (key === "max_tokens") return number(value);
    if (key === "trigger_names") return value.map((n) => `@${n}`).join(", ") || "none";
    if (key === "tools") return value.join(", ") || "none";
    return String(value);
  }

  // What a form box holds for a stored value ("" : the installation's).
  function boxText(kind, value) {
    if (value === null || value === undefined) return "";
    if (kind === "names") return value.join(", ");
    return String(value);
  }

  // -- opening and closing --------------------------------------------------------------

  const isOpen = () => !$("profile").hidden;

  function setOpen(open) {
    $("profile").hidden = !open;
    $("app").classList.toggle("profile-open", open);
    $("profile-toggle").setAttribute("aria-expanded", open ? "true" : "false");
    if (open && panel.jid) load({ refill: true });
  }

  // The page selected a group (app.js): its profile, if the panel is open.
  function select(jid, api) {
    panel.api = api;
    const toggle = $("profile-toggle");
    toggle.disabled = !jid;
    if (panel.jid === jid) return;
    panel.jid = jid;
    panel.profile = null;
    panel.dirty = false;
    panel.refill = false;
    $("profile-effect").replaceChildren();
    $("profile-tasks").textContent = "";
    buildForm();
    clearErrors();
    status("");
    if (isOpen()) load({ refill: true });
  }

  // -- reading ------------------------------------------------------------------------

  // refill: the form is to show what is stored, typed or not (on opening, after a save); the
  // wish outlives a read that a later one overtakes.
  async function load({ refill }) {
    const jid = panel.jid;
    if (!jid || !panel.api) return;
    if (refill) panel.refill = true;
    const ticket = ++panel.loading;
    try {
      const profile = await panel.api("GET", `groups/${enc(jid)}`);
      if (ticket !== panel.loading || jid !== panel.jid) return; // a later read, or another group
      panel.profile = profile;
      renderEffect(profile);
      if (panel.refill || !panel.dirty) fill(profile);
      panel.refill = false;
    } catch (error) {
      if (jid === panel.jid) status(`Could not read the profile: ${error.message}`, "refused");
    }
  }

  function whose(own) {
    return node("span", { className: `whose${own ? " own" : ""}`, text: own ? "group's own" : "installation's" });
  }

  function renderEffect(p) {
    const effect = p.in_effect;
    const quota = (key) => (p[key] === null ? p.installation[key] : p[key]);
    const names = shown("trigger_names", effect.trigger_names);
    // A budget of the group's own, or the installation's, that its model cannot use.
    const unused = !effect.thinking_budget && (p.thinking_budget === null ? p.installation.thinking_budget : p.thinking_budget);
    const thinking = `${shown("thinking_budget", effect.thinking_budget)}${unused ? " (the model does not think)" : ""}`;
    const rows = [
      ["model", "Model", effect.model, p.model !== null],
      ["max_tokens", "Max tokens", shown("max_tokens", effect.max_tokens), p.max_tokens !== null],
      ["thinking_budget", "Thinking", thinking, p.thinking_budget !== null],
      ["trigger_names", "Wakes on", p.requires_trigger ? names : `every message (names: ${names})`, p.trigger_names !== null],
      ["tools", "Tools", p.tools === null ? `${shown("tools", effect.tools)} (all)` : shown("tools", effect.tools), p.tools !== null],
      ["runs_per_hour", "Runs per hour", shown("runs_per_hour", quota("runs_per_hour")), p.runs_per_hour !== null],
      ["tokens_per_day", "Tokens per day", shown("tokens_per_day", quota("tokens_per_day")), p.tokens_per_day !== null],
    ];
    $("profile-effect").replaceChildren(
      ...rows.map(([key, label, value, own]) =>
        node("div", { className: "effect-row", dataset: { field: key, whose: own ? "group" : "installation" } },
          node("dt", { text: label }),
          node("dd", {}, node("span", { className: "effect-value", text: value }), " ", whose(own))),
      ),
    );
    const t = p.tasks;
    const total = t.active + t.paused + t.done + t.cancelled;
    $("profile-tasks").textContent =
      `${total} scheduled task${total === 1 ? "" : "s"}: ${t.active} active, ${t.paused} paused, ${t.done} done, ${t.cancelled} cancelled`;
    $("profile-tasks").dataset.active = String(t.active);
  }

  // -- the form -----------------------------------------------------------------------

  function buildForm() {
    const form = $("profile-form");
    const parts = FIELDS.map((f) => {
      const error = node("p", { className: "field-error", id: `profile-${f.key}-error`, role: "alert", hidden: true });
      const hint = f.hint ? node("p", { className: "field-hint muted", id: `profile-${f.key}-hint`, text: f.hint }) : null;
      if (f.kind === "tools") return toolsField(f, error);
      const box = node("input", {
        id: `profile-${f.key}`,
        name: f.key,
        type: "text",
        inputmode: f.kind === "whole" ? "numeric" : null,
        autocomplete: "off",
        spellcheck: "false",
        "aria-describedby": `profile-${f.key}-error${hint ? ` profile-${f.key}-hint` : ""}`,
      });
      return node("div", { className: `field${f.kind === "whole" ? " half" : ""}`, dataset: { field: f.key } },
        node("label", { for: box.id, text: f.label }), box, error, hint);
    });
    const buttons = node("div", { className: "profile-buttons" },
      node("button", { type: "submit", id: "profile-save", text: "Save" }),
      node("button", { type: "button", className: "link", id: "profile-revert", text: "Undo my edits", onclick: revert }));
    form.replaceChildren(...parts, buttons, node("p", { id: "profile-status", className: "profile-status", role: "status" }));
  }

  // Tools: all of them (the installation's), or only the ones ticked (none is a choice too).
  function toolsField(f, error) {
    const all = node("input", { type: "radio", name: "tools-mode", value: "all", id: "profile-tools-all" });
    const some = node("input", { type: "radio", name: "tools-mode", value: "some", id: "profile-tools-some" });
    const list = node("div", { className: "tool-list", id: "profile-tools-list" });
    const sync = () => {
      for (const box of list.querySelectorAll("input")) {
        box.disabled = all.checked;
        if (all.checked) box.checked = true;
      }
    };
    all.addEventListener("change", sync);
    some.addEventListener("change", sync);
    return node("fieldset", { className: "field tools", dataset: { field: f.key }, "aria-describedby": error.id },
      node("legend", { text: f.label }),
      node("label", { className: "choice" }, all, " all of them (the installation's)"),
      node("label", { className: "choice" }, some, " only these:"),
      list, error);
  }

  function fill(p) {
    const inst = p.installation;
    for (const f of FIELDS) {
      if (f.kind === "tools") {
        const list = $("profile-tools-list");
        list.replaceChildren(...inst.tools.map((tool) =>
          node("label", { className: "choice" },
            node("input", { type: "checkbox", name: "tool", value: tool, "aria-label": tool }), ` ${tool}`)));
        const own = p.tools;
        $(own === null ? "profile-tools-all" : "profile-tools-some").checked = true;
        for (const box of list.querySelectorAll("input")) {
          box.checked = own === null || own.includes(box.value);
          box.disabled = own === null;
        }
        continue;
      }
      const box = $(`profile-${f.key}`);
      box.value = boxText(f.kind, p[f.key]);
      box.placeholder = `installation's: ${shown(f.key, inst[f.key])}`;
    }
    panel.dirty = false;
  }

  function revert() {
    clearErrors();
    status("");
    if (panel.profile) fill(panel.profile);
  }

  // What the form says of each field: its value to send (null: the installation's), or a
  // refusal of its own for what cannot be sent at all (a word where a number goes).
  function read() {
    const values = {};
    const refused = {};
    for (const f of FIELDS) {
      if (f.kind === "tools") {
        values.tools = $("profile-tools-all").checked
          ? null
          : [...$("profile-tools-list").querySelectorAll("input:checked")].map((b) => b.value);
        continue;
      }
      const text = $(`profile-${f.key}`).value.trim();
      if (!text) values[f.key] = null;
      else if (f.kind === "whole") {
        if (/^-?\d+$/.test(text) && Number.isSafeInteger(Number(text))) values[f.key] = Number(text);
        else refused[f.key] = `${f.label}: a whole number (0 or more), or empty for the installation's`;
      } else if (f.kind === "names") {
        values[f.key] = text.split(/[\s,]+/).map((n) => n.replace(/^@/, "")).filter(Boolean);
        if (!values[f.key].length) values[f.key] = null;
      } else values[f.key] = text;
    }
    return { values, refused };
  }

  function clearErrors() {
    for (const error of document.querySelectorAll("#profile-form .field-error")) {
      error.hidden = true;
      error.textContent = "";
    }
    for (const box of document.querySelectorAll("#profile-form [aria-invalid]")) box.removeAttribute("aria-invalid");
  }

  // A refusal under the field it names (a field of the form, or the field a part of it is
  // under: "trigger_names.0"); false for a field the form does not show.
  function fieldError(field, message) {
    const key = String(field || "").split(".")[0];
    const error = FIELDS.some((f) => f.key === key) && $(`profile-${key}-error`);
    if (!error) return false;
    error.textContent = message;
    error.hidden = false;
    const box = key === "tools" ? $("profile-tools-some") : $(`profile-${key}`);
    box.setAttribute("aria-invalid", "true");
    box.focus();
    return true;
  }

  function status(text, kind) {
    const line = $("profile-status");
    if (!line) return;
    line.textContent = text;
    line.className = `profile-status${kind ? ` ${kind}` : ""}`;
  }

  async function save(event) {
    event.preventDefault();
    if (panel.saving || !panel.profile) return;
    clearErrors();
    const { values, refused } = read();
    const wrong = Object.entries(refused);
    if (wrong.length) {
      for (const [key, message] of wrong.reverse()) fieldError(key, message); // the first one focused
      status("Not saved.", "refused");
      return;
    }
    // Only what differs from the stored profile: the chat's message names just that.
    const changes = {};
    for (const [key, value] of Object.entries(values)) {
      if (JSON.stringify(value) !== JSON.stringify(panel.profile[key])) changes[key] = value;
    }
    if (!Object.keys(changes).length) {
      status("Nothing to change.");
      return;
    }
    const jid = panel.jid;
    panel.saving = true;
    $("profile-save").disabled = true;
    status("Saving…");
    try {
      await panel.api("PATCH", `groups/${enc(jid)}`, changes);
      if (jid !== panel.jid) return;
      status("Saved; the chat says what changed.", "saved");
      await load({ refill: true });
    } catch (error) {
      if (jid !== panel.jid) return;
      // Nothing typed is lost: the form stays as it was sent.
      if (error.status === 400 && fieldError(error.field, detailOf(error))) status("Not saved.", "refused");
      else status(`Not saved: ${detailOf(error)}`, "refused");
    } finally {
      panel.saving = false;
      const button = $("profile-save");
      if (button) button.disabled = false;
    }
  }

  // The server's words, without the " (field)" app.js's ApiError adds to its message.
  function detailOf(error) {
    const suffix = error.field ? ` (${error.field})` : "";
    const message = error.message || String(error);
    return suffix && message.endsWith(suffix) ? message.slice(0, -suffix.length) : message;
  }

  // -- wiring -------------------------------------------------------------------------

  $("profile-toggle").addEventListener("click", () => setOpen(!isOpen()));
  $("profile-close").addEventListener("click", () => setOpen(false));
  $("profile-form").addEventListener("submit", save);
  $("profile-form").addEventListener("input", () => { panel.dirty = true; });
  $("profile-form").addEventListener("change", () => { panel.dirty = true; });

  // A host message shown while the panel is open (a change of the profile says so in the
  // chat, whoever made it): read the profile again, once for a burst of them.
  let again = null;
  panel.observer = new MutationObserver((records) => {
    if (!isOpen() || !panel.jid) return;
    const host = records.some((r) => [...r.addedNodes].some((n) => n.dataset && n.dataset.type === "host"));
    if (!host) return;
    clearTimeout(again);
    again = setTimeout(() => load({ refill: false }), 150);
  });
  panel.observer.observe($("messages"), { childList: true });

  return { select };
})();
