package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// Configs of the peers, written into the run's temp dir. Both are tuned
// the way an operator would for this test: one worker/thread, keep-alive
// to the origin, no access log, no per-connection request cap.

func nginxConfig(dir, listen, origin string) (string, error) {
	for _, d := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	conf := fmt.Sprintf(`# gatewaybench: nginx, one worker, upstream keep-alive.
worker_processes 1;
master_process off;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream origin {
        server %[3]s;
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen %[2]s;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            # 64 KiB responses stay in memory, never in a temp file.
            proxy_buffers 16 8k;
            proxy_max_temp_file_size 0;
        }
    }
}
`, dir, listen, origin)
	path := filepath.Join(dir, "nginx.conf")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

func haproxyConfig(dir, listen, origin string) (string, error) {
	conf := fmt.Sprintf(`# gatewaybench: HAProxy, one thread, server-side keep-alive reuse.
global
    nbthread 1
    maxconn 4096
    pidfile %[1]s/haproxy.pid
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
frontend fe
    bind %[2]s
    default_backend be
backend be
    server origin %[3]s maxconn 1000
`, dir, listen, origin)
	path := filepath.Join(dir, "haproxy.cfg")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}
