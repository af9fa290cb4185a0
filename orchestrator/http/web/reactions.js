"use strict";
// Reactions on the page's messages: a row of badges under a message, one per emoji with
// its count, from the stream's `reaction` events. The stream sends every reaction of the
// chat when it opens, again after a reset or a reconnect: each is kept once, by its id.
// A reaction may come before its message (a long history's next page): it is drawn when
// the message is.
window.AgentReactions = (() => {
  const bySeq = new Map(); // message seq -> Map(reaction id -> reaction)

  function clear() {
    bySeq.clear();
  }

  // Keep `reaction` and redraw its message's badges if `shown` (seq -> article) has it.
  function add(reaction, shown) {
    if (typeof reaction.message_seq !== "number" || typeof reaction.emoji !== "string") return;
    let kept = bySeq.get(reaction.message_seq);
    if (!kept) bySeq.set(reaction.message_seq, (kept = new Map()));
    if (kept.has(reaction.id)) return;
    kept.set(reaction.id, reaction);
    const node = shown.get(reaction.message_seq);
    if (node) decorate(reaction.message_seq, node);
  }

  // Draw the badges of message `seq` on its article `node` (a new node has none yet).
  function decorate(seq, node) {
    const kept = bySeq.get(seq);
    let bar = node.querySelector(":scope > .reactions");
    if (!kept || !kept.size) {
      if (bar) bar.remove();
      return;
    }
    const counts = new Map(); // emoji -> who reacted
    for (const r of kept.values()) {
      const who = r.sender === "bot" ? "the agent" : r.sender;
      counts.set(r.emoji, [...(counts.get(r.emoji) || []), who]);
    }
    if (!bar) {
      bar = document.createElement("div");
      bar.className = "reactions";
      node.append(bar);
    }
    bar.replaceChildren(
      ...[...counts].map(([emoji, who]) => {
        const badge = document.createElement("span");
        badge.className = "reaction";
        badge.textContent = who.length > 1 ? `${emoji} ${who.length}` : emoji;
        badge.title = `${emoji} from ${who.join(", ")}`;
        return badge;
      }),
    );
  }

  return { add, clear, decorate };
})();
