// A key-value store over HTTP kept in memory, the state of a typical
// Node.js service (the same protocol as kvserver.go and KvServer.java).
//
// Usage: node kv_server.js PORT PIDFILE
//
//   PUT /k/KEY   (body: the value)  stores it, answers "ok"
//   GET /k/KEY   the value, or 404
//   GET /digest  "COUNT HEX": the number of keys and the SHA-256 over every
//                key in byte order, each as KEY "\0" VALUE "\n"
//
// Writes PIDFILE once it listens on 127.0.0.1:PORT.
"use strict";
const http = require("http");
const crypto = require("crypto");
const fs = require("fs");

const [port, pidfile] = process.argv.slice(2);
const store = new Map();

function digest() {
  const keys = [...store.keys()].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  const h = crypto.createHash("sha256");
  for (const k of keys) {
    h.update(k);
    h.update("\0");
    h.update(store.get(k));
    h.update("\n");
  }
  return `${keys.length} ${h.digest("hex")}`;
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    if (req.url.startsWith("/k/") && req.method === "PUT") {
      store.set(req.url.slice(3), Buffer.concat(chunks));
      res.end("ok");
    } else if (req.url.startsWith("/k/") && req.method === "GET") {
      const v = store.get(req.url.slice(3));
      if (v === undefined) {
        res.statusCode = 404;
        res.end();
      } else {
        res.end(v);
      }
    } else if (req.url === "/digest") {
      res.end(digest());
    } else {
      res.statusCode = 400;
      res.end();
    }
  });
});
server.keepAliveTimeout = 0;
server.listen(Number(port), "127.0.0.1", () => {
  fs.writeFileSync(pidfile + ".tmp", `${process.pid}\n`);
  fs.renameSync(pidfile + ".tmp", pidfile);
});
process.on("SIGTERM", () => process.exit(0));
