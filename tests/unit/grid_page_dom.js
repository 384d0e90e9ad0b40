// Runs gridcore/api/static/grid.js under Node with a minimal DOM (no browser): the page's
// static elements (given as JSON: id -> attributes, parsed by the test from the served
// HTML), fetch() answering the given JSON, then every element with an id printed as JSON
// {id: {attrs, text, cells}} once the page has rendered. Usage:
//   node grid_page_dom.js <grid.js> <page.json> <answer.json>
"use strict";

const fs = require("fs");
const [script, pageFile, answerFile] = process.argv.slice(2);
const page = JSON.parse(fs.readFileSync(pageFile, "utf8"));
const answer = fs.readFileSync(answerFile, "utf8");
const ids = {};

const kebab = (name) => name.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase());

class FakeNode {
  constructor() {
    this.children = [];
  }
  append(...nodes) {
    for (const n of nodes) this.children.push(n instanceof FakeNode ? n : new FakeText(n));
  }
  replaceChildren(...nodes) {
    this.children = [];
    this.append(...nodes);
  }
  get textContent() {
    return this.children.map((c) => c.textContent).join("");
  }
}

class FakeText extends FakeNode {
  constructor(text) {
    super();
    this.text = String(text);
  }
  get textContent() {
    return this.text;
  }
}

class FakeElement extends FakeNode {
  constructor(tag, attrs) {
    super();
    this.tag = tag;
    this.attrs = {};
    for (const [k, v] of Object.entries(attrs || {})) this.setAttribute(k, v);
    const self = this;
    this.dataset = new Proxy({}, {
      get: (_o, key) => self.attrs["data-" + kebab(String(key))],
      set: (_o, key, value) => {
        self.attrs["data-" + kebab(String(key))] = String(value);
        return true;
      },
    });
  }
  setAttribute(key, value) {
    this.attrs[key] = String(value);
    if (key === "id") ids[String(value)] = this;
  }
  set textContent(text) {
    this.children = [new FakeText(text)];
  }
  get textContent() {
    return super.textContent;
  }
  set hidden(on) {
    if (on) this.attrs.hidden = "";
    else delete this.attrs.hidden;
  }
  get hidden() {
    return "hidden" in this.attrs;
  }
}

global.Node = FakeNode;
const body = new FakeElement("body", page.body);
for (const [id, attrs] of Object.entries(page.elements)) new FakeElement(attrs.tag, { ...attrs, id });
global.document = {
  body,
  createElement: (tag) => new FakeElement(tag),
  createElementNS: (_ns, tag) => new FakeElement(tag),
  createTextNode: (text) => new FakeText(text),
  getElementById: (id) => ids[id] || null,
};
global.fetch = async () => ({ ok: true, status: 200, statusText: "OK", json: async () => JSON.parse(answer) });
global.setInterval = () => 0;

function describe(node) {
  // a row's cells by data-field, with their data-value, text and nested data-* children
  const cells = {};
  const walk = (n) => {
    if (!(n instanceof FakeElement)) return;
    if (n !== node && n.attrs["data-field"] !== undefined && !(n.attrs["data-field"] in cells)) {
      cells[n.attrs["data-field"]] = { value: n.attrs["data-value"], text: n.textContent, items: items(n) };
    }
    n.children.forEach(walk);
  };
  walk(node);
  return { tag: node.tag, attrs: node.attrs, text: node.textContent, cells, items: items(node) };
}

function items(node) {
  // nested elements that carry data-kind / data-state / list items: [attrs, text]
  const found = [];
  const walk = (n) => {
    if (!(n instanceof FakeElement)) return;
    const tagged = n.tag === "span" && ("data-kind" in n.attrs || "data-state" in n.attrs);
    if (n !== node && (tagged || n.tag === "li")) found.push([n.attrs, n.textContent]);
    n.children.forEach(walk);
  };
  walk(node);
  return found;
}

require(require("path").resolve(script));
setTimeout(() => {
  const out = {};
  for (const [id, node] of Object.entries(ids)) out[id] = describe(node);
  process.stdout.write(JSON.stringify(out));
}, 50);
