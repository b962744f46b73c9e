// A key-value store over HTTP kept in memory, the state of a typical JVM
// service (the same protocol as kv_server.js and kvserver.go), on the JDK's
// own HTTP server with a pool of 4 handler threads.
//
// Usage: java KvServer.java PORT PIDFILE (or compiled: java -cp DIR KvServer)
//
//   PUT /k/KEY   (body: the value)  stores it, answers "ok"
//   GET /k/KEY   the value, or 404
//   GET /digest  "COUNT HEX": the number of keys and the SHA-256 over every
//                key in byte order, each as KEY "\0" VALUE "\n"
//
// Writes PIDFILE once it listens on 127.0.0.1:PORT.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.Executors;

public class KvServer {
    // Keys are ASCII: String order is byte order.
    private static final Map<String, byte[]> store = new TreeMap<>();

    private static void reply(HttpExchange ex, int code, byte[] body) throws IOException {
        ex.sendResponseHeaders(code, body.length == 0 ? -1 : body.length);
        try (OutputStream o = ex.getResponseBody()) {
            o.write(body);
        }
    }

    private static String digest() throws Exception {
        MessageDigest h = MessageDigest.getInstance("SHA-256");
        int n;
        synchronized (store) {
            n = store.size();
            for (Map.Entry<String, byte[]> e : store.entrySet()) {
                h.update(e.getKey().getBytes(StandardCharsets.UTF_8));
                h.update((byte) 0);
                h.update(e.getValue());
                h.update((byte) '\n');
            }
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : h.digest()) {
            hex.append(String.format("%02x", b));
        }
        return n + " " + hex;
    }

    private static void handle(HttpExchange ex) throws IOException {
        try {
            String path = ex.getRequestURI().getPath();
            byte[] body = ex.getRequestBody().readAllBytes();
            if (path.equals("/digest")) {
                reply(ex, 200, digest().getBytes(StandardCharsets.UTF_8));
            } else if (path.startsWith("/k/") && ex.getRequestMethod().equals("PUT")) {
                synchronized (store) {
                    store.put(path.substring(3), body);
                }
                reply(ex, 200, "ok".getBytes(StandardCharsets.UTF_8));
            } else if (path.startsWith("/k/") && ex.getRequestMethod().equals("GET")) {
                byte[] v;
                synchronized (store) {
                    v = store.get(path.substring(3));
                }
                if (v == null) {
                    reply(ex, 404, new byte[0]);
                } else {
                    reply(ex, 200, v);
                }
            } else {
                reply(ex, 400, new byte[0]);
            }
        } catch (Exception e) {
            reply(ex, 500, e.toString().getBytes(StandardCharsets.UTF_8));
        }
    }

    public static void main(String[] args) throws Exception {
        HttpServer server =
                HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(args[0])), 64);
        server.createContext("/", KvServer::handle);
        server.setExecutor(Executors.newFixedThreadPool(4));
        server.start();
        Path tmp = Path.of(args[1] + ".tmp");
        Files.writeString(tmp, ProcessHandle.current().pid() + "\n");
        Files.move(tmp, Path.of(args[1]), StandardCopyOption.ATOMIC_MOVE);
    }
}
