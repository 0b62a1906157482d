# shellcheck shell=bash
# Sourced by scripts/services.sh: the certificates of the mail servers that speak TLS
# (Postfix, the second IMAP server). One private CA (CA:TRUE) under <services dir>/tls signs one
# server certificate (CA:FALSE, as rustls requires of an end entity) for localhost and
# 127.0.0.1. Clients trust the CA: WH_TEST_MAIL_CA, or `ca_file` in the host's settings.
#
#   mail_tls    makes them when missing (idempotent); servers' NAME_up call it first

MAIL_TLS_DIR=$DIR/tls
EXTRAS+=(tls)

mail_tls() {
    private_dir "$MAIL_TLS_DIR"
    chmod 755 "$MAIL_TLS_DIR" # the servers' own users read the certificate (not the key's mode)
    [ -s "$MAIL_TLS_DIR/server.pem" ] && [ -s "$MAIL_TLS_DIR/ca.pem" ] && return 0
    local d=$MAIL_TLS_DIR
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=worker-host test mail CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1 || die "tls: cannot make the test CA"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
        -keyout "$d/server.key" -out "$d/server.csr" >/dev/null 2>&1 || die "tls: cannot make a key"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 3650 -extfile "$d/server.ext" -out "$d/server.pem" >/dev/null 2>&1 ||
        die "tls: cannot sign the server certificate"
    chmod 644 "$d/server.pem" "$d/ca.pem"
    chmod 640 "$d/server.key"
    rm -f "$d/server.csr"
    say "tls: test CA and server certificate (localhost, 127.0.0.1) in $d"
}

tls_packages() { command -v openssl >/dev/null || echo openssl; }
tls_up() { mail_tls; }
tls_down() { :; }
tls_status() { status_line tls "$MAIL_TLS_DIR/ca.pem" test -s "$MAIL_TLS_DIR/ca.pem"; }
tls_env() {
    echo "export WH_TEST_MAIL_CA=$DIR/tls/ca.pem"
}
