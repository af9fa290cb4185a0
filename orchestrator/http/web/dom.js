"use strict";
// The page's one way to make an element: every text goes in as text, never markup.
// `props`: text, className, dataset, on<event> listeners, other attributes (true: present);
// null, undefined and false props and children are left out. Loaded before the other scripts.
window.AgentDom = (() => {
  function node(tag, props, ...children) {
    const made = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") made.textContent = String(value);
      else if (key === "className") made.className = value;
      else if (key === "dataset") Object.assign(made.dataset, value);
      else if (key.startsWith("on")) made.addEventListener(key.slice(2), value);
      else made.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      made.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return made;
  }

  return { node };
})();
