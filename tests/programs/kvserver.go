// A key-value store over HTTP kept in memory, the state of a typical Go
// service (the same protocol as kv_server.js and KvServer.java).
//
// Usage: kvserver PORT PIDFILE
//
//	PUT /k/KEY   (body: the value)  stores it, answers "ok"
//	GET /k/KEY   the value, or 404
//	GET /digest  "COUNT HEX": the number of keys and the SHA-256 over every
//	             key in byte order, each as KEY "\0" VALUE "\n"
//
// Writes PIDFILE once it listens on 127.0.0.1:PORT.
package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
)

var (
	mu    sync.Mutex
	store = map[string][]byte{}
)

func digest() string {
	mu.Lock()
	defer mu.Unlock()
	keys := make([]string, 0, len(store))
	for k := range store {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write(store[k])
		h.Write([]byte{'\n'})
	}
	return fmt.Sprintf("%d %x", len(keys), h.Sum(nil))
}

func handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/digest" {
		io.WriteString(w, digest())
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/k/") {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	key := strings.TrimPrefix(r.URL.Path, "/k/")
	switch r.Method {
	case http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		store[key] = body
		mu.Unlock()
		io.WriteString(w, "ok")
	case http.MethodGet:
		mu.Lock()
		v, found := store[key]
		mu.Unlock()
		if !found {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Write(v)
	default:
		w.WriteHeader(http.StatusBadRequest)
	}
}

func main() {
	l, err := net.Listen("tcp", "127.0.0.1:"+os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmp := os.Args[2] + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Rename(tmp, os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	http.Serve(l, http.HandlerFunc(handle))
}
