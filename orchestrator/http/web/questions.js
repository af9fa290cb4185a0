// The agent's questions on the chat page: a question message (its APPROVAL envelope) shows
// its options as buttons, and a text box when it takes free words; an answer is
// POST /api/chats/{chat}/questions/{id}/answer (as the operator: the page holds the token).
// Once a question is answered or expired (GET /api/chats/{chat}/questions says which), its
// buttons are greyed out and say who answered what.  Everything from the server goes in
// through textContent only, as in app.js.  app.js calls render() and refresh().
"use strict";

window.AgentQuestions = (() => {
  const boxes = new Map(); // question id -> Set of the boxes that show it
  const known = new Map(); // question id -> the question as the API last said it
  const refreshing = new Map(); // chat id -> the refresh under way (one at a time per chat)

  const enc = encodeURIComponent;

  function node(tag, props, ...children) {
    const made = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") made.textContent = value;
      else if (key === "dataset") Object.assign(made.dataset, value);
      else if (key.startsWith("on")) made.addEventListener(key.slice(2), value);
      else made[key] = value;
    }
    made.append(...children);
    return made;
  }

  function valid(payload) {
    return (
      payload &&
      typeof payload.question_id === "string" &&
      typeof payload.question === "string" &&
      Array.isArray(payload.options) &&
      payload.options.every((o) => typeof o === "string")
    );
  }

  // The question with its answering controls; null for a payload that is no question's.
  function render(payload, chatJid, api) {
    if (!valid(payload)) return null;
    const id = payload.question_id;
    const box = node("div", { className: "question", dataset: { questionId: id, state: "open" } });
    const note = node("p", { className: "question-note muted", role: "status" });
    const send = (body) => answer(chatJid, id, body, api, box, note);
    const options = node("div", { className: "question-options" });
    payload.options.forEach((option, i) => {
      const button = node("button", { type: "button", className: "option", text: option, dataset: { index: String(i) } });
      if (payload.multiple) {
        button.setAttribute("aria-pressed", "false");
        button.addEventListener("click", () =>
          button.setAttribute("aria-pressed", button.getAttribute("aria-pressed") === "true" ? "false" : "true"),
        );
      } else {
        button.addEventListener("click", () => send({ option: String(i + 1) }));
      }
      options.append(button);
    });
    box.append(node("div", { className: "text question-text", text: payload.question }), options);
    if (payload.multiple) {
      const picked = () => [...options.querySelectorAll("button[aria-pressed=true]")].map((b) => String(Number(b.dataset.index) + 1));
      box.append(
        node("button", {
          type: "button",
          className: "question-send",
          text: "Answer with the chosen",
          onclick: () => (picked().length ? send({ options: picked() }) : (note.textContent = "Choose at least one.")),
        }),
      );
    }
    if (payload.allow_other) {
      const input = node("input", { type: "text", className: "question-other-text", maxLength: 2000, placeholder: "Another answer" });
      box.append(
        node(
          "form",
          {
            className: "question-other",
            onsubmit: (event) => {
              event.preventDefault();
              if (input.value.trim()) send({ text: input.value.trim() });
            },
          },
          input,
          node("button", { type: "submit", text: "Answer" }),
        ),
      );
    }
    box.append(note);
    if (!boxes.has(id)) boxes.set(id, new Set());
    boxes.get(id).add(box);
    if (known.has(id)) show(known.get(id));
    else refresh(chatJid, api);
    return box;
  }

  async function answer(chatJid, id, body, api, box, note) {
    for (const control of box.querySelectorAll("button, input")) control.disabled = true;
    note.textContent = "Sending…";
    try {
      show(await api("POST", `chats/${enc(chatJid)}/questions/${enc(id)}/answer`, body));
    } catch (error) {
      note.textContent = error && error.message ? error.message : String(error);
      for (const control of box.querySelectorAll("button, input")) control.disabled = false;
      refresh(chatJid, api); // answered elsewhere meanwhile: the box says so
    }
  }

  // A question as the API says it now, on every box that shows it.
  function show(question) {
    if (!question || typeof question.id !== "string") return;
    known.set(question.id, question);
    const shown = boxes.get(question.id);
    if (!shown) return;
    for (const box of [...shown]) {
      if (!box.isConnected && box.dataset.rendered) {
        shown.delete(box); // replaced by a newer copy of its message
        continue;
      }
      box.dataset.rendered = "1";
      box.dataset.state = question.state;
      if (question.state === "open") continue;
      box.classList.add("question-closed");
      const answer = question.answer || {};
      const picked = new Set(Array.isArray(answer.indexes) ? answer.indexes : []);
      for (const button of box.querySelectorAll("button.option")) {
        if (picked.has(Number(button.dataset.index))) button.classList.add("chosen");
      }
      for (const control of box.querySelectorAll("button, input")) control.disabled = true;
      const words = [...(Array.isArray(answer.options) ? answer.options : []), ...(answer.text ? [answer.text] : [])];
      const who = question.answered_by_name || question.answered_by || "someone";
      box.querySelector(".question-note").textContent =
        question.state === "answered"
          ? `Answered: ${words.join(", ")} (by ${who}${question.answered_via ? ` via ${question.answered_via}` : ""})`
          : `Closed: ${question.closed_why || question.state}`;
    }
  }

  // The chat's questions as they stand, onto the boxes (after a page load, and whenever a
  // message that closes a question arrives).
  function refresh(chatJid, api) {
    if (refreshing.has(chatJid)) return refreshing.get(chatJid);
    const done = (async () => {
      await new Promise((resolve) => setTimeout(resolve, 50)); // a page of messages' boxes, one request
      try {
        const questions = await api("GET", `chats/${enc(chatJid)}/questions`);
        for (const question of Array.isArray(questions) ? questions : []) show(question);
      } catch {
        // The stream reconnects and the next closing message refreshes again.
      } finally {
        refreshing.delete(chatJid);
      }
    })();
    refreshing.set(chatJid, done);
    return done;
  }

  return { render, refresh };
})();
