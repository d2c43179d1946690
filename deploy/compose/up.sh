#!/usr/bin/env bash
# make compose-up: create what the compose cluster reads (a CA and
# certificates, the gossip key, ACL tokens with preset secrets), then start
# it in order: servers, ACL bootstrap and least-privilege tokens through
# the published port, the gateway's route, then agents, demos and gateway.
# Run again on a running cluster, it only starts what is missing.
#
# Environment (the Makefile sets the first four):
#   COMPOSE_PROJECT_NAME  the compose project
#   LODESTONE_IMAGE       the image to run (make image builds lodestone:latest)
#   LODESTONE_SECRETS     directory for certificates and tokens (root-owned;
#                         each container's own subdirectory is owned by 65532)
#   LODESTONE_CLI         a lodestone binary that runs on this host
#   DOCKER_COMPOSE        [docker-compose]
#   LODESTONE_UP_TIMEOUT  seconds to wait for each stage [120]
# and the compose file's port and subnet variables.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
: "${COMPOSE_PROJECT_NAME:?set COMPOSE_PROJECT_NAME (make compose-up does)}"
secrets=${LODESTONE_SECRETS:?set LODESTONE_SECRETS to the directory for certificates and tokens (make compose-up does)}
cli=${LODESTONE_CLI:?set LODESTONE_CLI to a lodestone binary for this host (make compose-up does)}
image=${LODESTONE_IMAGE:-lodestone:latest}
timeout=${LODESTONE_UP_TIMEOUT:-120}
read -r -a dc <<<"${DOCKER_COMPOSE:-docker-compose}"
dc+=(-f "$here/docker-compose.yml")
export LODESTONE_IMAGE=$image LODESTONE_SECRETS=$secrets

# The user the image runs as (deploy/image/passwd).
uid=65532
servers=(server1 server2 server3)
clients=(agent1 agent2 gateway)

say() { printf '==> %s\n' "$*"; }
die() {
	printf 'compose-up: %s\n' "$*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || die "run as root: each container's key files must be owned by its user ($uid) and readable by nobody else"
[ -x "$cli" ] || die "$cli is not an executable lodestone binary (make image builds one)"
docker image inspect "$image" >/dev/null 2>&1 || die "image $image not found: run make image"

# issue creates a certificate for one container and puts it, its key and
# the CA under $secrets/<node>/ as cert.pem, key.pem and ca.pem.
issue() {
	local kind=$1 node=$2 dir=$secrets/$2
	shift 2
	mkdir -p "$dir"
	"$cli" tls cert create "--$kind" --node "$node" --dir "$dir" \
		--ca "$secrets/pki/lodestone-ca.pem" --key "$secrets/pki/lodestone-ca-key.pem" "$@" >/dev/null
	mv "$dir/$kind-$node.pem" "$dir/cert.pem"
	mv "$dir/$kind-$node-key.pem" "$dir/key.pem"
	cp "$secrets/pki/lodestone-ca.pem" "$dir/ca.pem"
}

new_secrets() {
	say "creating a CA, certificates, the gossip key and token secrets in $secrets"
	(
		umask 077
		mkdir -p "$secrets/pki"
		"$cli" tls ca create --dir "$secrets/pki" >/dev/null
		for s in "${servers[@]}"; do
			# NB: members and clients dial each other by service name.
			issue server "$s" --additional-dnsname "$s"
		done
		for c in "${clients[@]}" ops; do
			issue client "$c"
		done
		printf 'LODESTONE_GOSSIP_KEY=%s\n' "$(head -c 32 /dev/urandom | base64 -w0)" >"$secrets/gossip.env"
		for c in "${clients[@]}"; do
			cat /proc/sys/kernel/random/uuid >"$secrets/$c/token"
		done
		cat /proc/sys/kernel/random/uuid >"$secrets/ops/app-token"
	)
	# NB: each container reads its own directory as user $uid; keys and
	# tokens stay 0600. ops/ and pki/ (the CA key) stay root's.
	for d in "${servers[@]}" "${clients[@]}"; do
		chmod 0644 "$secrets/$d/cert.pem" "$secrets/$d/ca.pem"
		chown -R "$uid:$uid" "$secrets/$d"
	done
	chmod 0755 "$secrets"
}

# health prints a compose service's container health (or its state).
health() {
	local id
	id=$("${dc[@]}" ps -q "$1" 2>/dev/null) || true
	[ -n "$id" ] || {
		echo missing
		return
	}
	docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
}

wait_healthy() {
	local deadline=$((SECONDS + timeout)) s st pending
	while :; do
		pending=()
		for s in "$@"; do
			st=$(health "$s")
			[ "$st" = healthy ] || pending+=("$s=$st")
		done
		[ ${#pending[@]} -eq 0 ] && return 0
		if [ $SECONDS -ge $deadline ]; then
			"${dc[@]}" ps >&2 || true
			for s in "$@"; do "${dc[@]}" logs --tail 30 "$s" >&2 || true; done
			die "not healthy within ${timeout}s: ${pending[*]}"
		fi
		sleep 1
	done
}

[ -f "$secrets/ops/app-token" ] || new_secrets

say "starting the servers"
"${dc[@]}" up -d --no-build "${servers[@]}"
wait_healthy "${servers[@]}"

# The operator's view: the published ports, over mutual TLS.
http_addr=https://$("${dc[@]}" port server1 8500)
grpc_addr=$("${dc[@]}" port server1 7400)
export LODESTONE_CACERT=$secrets/ops/ca.pem LODESTONE_CLIENT_CERT=$secrets/ops/cert.pem LODESTONE_CLIENT_KEY=$secrets/ops/key.pem
export LODESTONE_HTTP_ADDR=$http_addr LODESTONE_ENDPOINTS=$grpc_addr

mgmt=$secrets/ops/management-token
if [ -s "$mgmt" ] && LODESTONE_TOKEN=$(cat "$mgmt") "$cli" acl token read --self >/dev/null 2>&1; then
	say "ACLs already set up"
else
	say "bootstrapping ACLs through $http_addr"
	deadline=$((SECONDS + timeout))
	# NB: retried while the servers elect a leader; refused for good once
	# done, and then only the earlier management token can act.
	until out=$("$cli" acl bootstrap --format json 2>&1); do
		case $out in
		*"no longer allowed"*) die "acl bootstrap: $out: $mgmt is missing or not valid; make compose-down, then make compose-up" ;;
		esac
		[ $SECONDS -lt $deadline ] || die "acl bootstrap: not done within ${timeout}s: $out"
		sleep 1
	done
	secret=$(printf '%s\n' "$out" | sed -n 's/^ *"SecretID": *"\([^"]*\)".*/\1/p')
	[ -n "$secret" ] || die "acl bootstrap printed no SecretID: $out"
	(
		umask 077
		printf '%s\n' "$secret" >"$mgmt"
	)
	export LODESTONE_TOKEN=$secret

	say "creating least-privilege policies and tokens"
	for a in agent1 agent2; do
		"$cli" acl policy create --name "agent-$a" --description "agent $a: its node and the demo service" \
			--rules "node \"$a\" { policy = \"write\" }
service \"demo\" { policy = \"write\" }" >/dev/null
		"$cli" acl token create --description "agent $a" --policy-name "agent-$a" --secret "$(cat "$secrets/$a/token")" >/dev/null
	done
	"$cli" acl policy create --name gateway --description "gateway: routes, and every service's healthy instances" \
		--rules 'key_prefix "gateway/" { policy = "read" }
service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }' >/dev/null
	"$cli" acl token create --description gateway --policy-name gateway --secret "$(cat "$secrets/gateway/token")" >/dev/null
	"$cli" acl policy create --name app --description "applications: keys under app/, read the catalog" \
		--rules 'key_prefix "app/" { policy = "write" }
service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }' >/dev/null
	"$cli" acl token create --description app --policy-name app --secret "$(cat "$secrets/ops/app-token")" >/dev/null

	say "routing / to the demo service"
	"$cli" kv put gateway/routes/demo '{"name": "demo", "path_prefix": "/", "service": "demo"}' >/dev/null
fi

say "starting agents, demo services and the gateway"
"${dc[@]}" up -d --no-build
wait_healthy "${servers[@]}" agent1 agent2 demo1 demo2 gateway

cat <<EOF
==> the cluster is up (project $COMPOSE_PROJECT_NAME)
  gateway:       http://$("${dc[@]}" port gateway 8080)/
  servers HTTP:  $(for s in "${servers[@]}"; do printf 'https://%s ' "$("${dc[@]}" port "$s" 8500)"; done)
  servers gRPC:  $(for s in "${servers[@]}"; do printf '%s ' "$("${dc[@]}" port "$s" 7400)"; done)
  client TLS:    $secrets/ops/{ca,cert,key}.pem
  tokens:        $secrets/ops/management-token (management), $secrets/ops/app-token (key_prefix app/)
EOF
