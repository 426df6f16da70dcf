/*
 * A field device talking to ferry, on libmosquitto and cJSON
 * (docs/PROTOCOL.md, "South"); the C twin of examples/python/device.py.
 *
 *   cc -o device examples/c/device.c -lmosquitto -lcjson
 *   ./device --id press-7 --send 3 [--host H] [--port 1883]
 *            [--data-dir DIR] [--password-file F] [--exit-when-done]
 *
 * - One connection per device, client id = device id (the embedded broker
 *   refuses any other; with --password-file the username is the id too).
 * - Last will {"online": false} on devices/{id}/status, {"online": true}
 *   there once subscribed (both retained), then a pull.
 * - Uplinks: each reading is written to the journal ({id}.journal, one
 *   envelope per line, replaced atomically and fsynced) before it is
 *   published on devices/{id}/up/telemetry, and resent with the same msg_id
 *   after every reconnect and each receipt timeout (5 s doubling to 60 s)
 *   until a receipt says stored, delivered or failed (a rejected for rate
 *   or disk_budget is retried, any other is final). A restarted device
 *   resends its journal: nothing is stored twice.
 * - Downlinks: each message of a batch with a seq past the cursor is
 *   appended to {id}.inbox and fsynced (the cursor is the last seq there),
 *   then {"upto": last seq} goes to devices/{id}/confirm.
 *
 * One JSON line per event on stdout; SIGINT/SIGTERM stop it cleanly.
 * Single-threaded: mosquitto_loop() runs the network, the loop the rest.
 */

#include <cjson/cJSON.h>
#include <getopt.h>
#include <mosquitto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PENDING 256
#define MAX_LINE 1024
#define MAX_SHOWN 200

struct pending {
    char msg_id[80];
    char body[MAX_LINE];
    double due; /* monotonic seconds; 0: now */
    double timeout;
};

struct device {
    const char *id;
    char prefix[96];
    char journal[512];
    char inbox[512];
    struct pending pending[MAX_PENDING];
    int npending;
    unsigned long long cursor;
    int online;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Prints one event line and frees it. */
static void emit(cJSON *event)
{
    char *line = cJSON_PrintUnformatted(event);
    if (line) {
        puts(line);
        fflush(stdout);
        free(line);
    }
    cJSON_Delete(event);
}

static cJSON *event(const char *name)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "event", name);
    return e;
}

/* A string a peer chose, cut to MAX_SHOWN bytes. */
static void add_shown(cJSON *e, const char *key, const char *value)
{
    char cut[MAX_SHOWN + 1];
    snprintf(cut, sizeof cut, "%s", value ? value : "");
    cJSON_AddStringToObject(e, key, cut);
}

static const char *str_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int fsync_file(FILE *f) { return fflush(f) == 0 && fsync(fileno(f)) == 0 ? 0 : -1; }

/* Replaces the journal with the pending envelopes: write, fsync, rename. */
static void save_journal(struct device *d)
{
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", d->journal);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        exit(1);
    }
    for (int i = 0; i < d->npending; i++)
        fprintf(f, "%s\n", d->pending[i].body);
    if (fsync_file(f) != 0 || fclose(f) != 0 || rename(tmp, d->journal) != 0) {
        perror(d->journal);
        exit(1);
    }
}

static void add_pending(struct device *d, const char *msg_id, const char *body)
{
    struct pending *p = &d->pending[d->npending++];
    snprintf(p->msg_id, sizeof p->msg_id, "%s", msg_id);
    snprintf(p->body, sizeof p->body, "%s", body);
    p->due = 0;
    p->timeout = 5;
}

static void load(struct device *d)
{
    char line[MAX_LINE + 2];
    FILE *f = fopen(d->journal, "r");
    while (f && d->npending < MAX_PENDING && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        cJSON *env = cJSON_Parse(line);
        if (str_field(env, "msg_id"))
            add_pending(d, str_field(env, "msg_id"), line);
        cJSON_Delete(env);
    }
    if (f)
        fclose(f);
    /* The cursor: the last seq committed to the inbox file. */
    f = fopen(d->inbox, "r");
    while (f && fgets(line, sizeof line, f)) {
        cJSON *m = cJSON_Parse(line);
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(m, "seq");
        if (cJSON_IsNumber(seq) && seq->valuedouble > d->cursor)
            d->cursor = (unsigned long long)seq->valuedouble;
        cJSON_Delete(m);
    }
    if (f)
        fclose(f);
    cJSON *e = event("started");
    cJSON *ids = cJSON_AddArrayToObject(e, "pending");
    for (int i = 0; i < d->npending; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateString(d->pending[i].msg_id));
    emit(e);
}

static void publish(struct mosquitto *m, struct device *d, const char *kind, const char *body,
                    int retain)
{
    char topic[160];
    snprintf(topic, sizeof topic, "%s/%s", d->prefix, kind);
    mosquitto_publish(m, NULL, topic, (int)strlen(body), body, 1, retain);
}

/* Uplinks: journal, publish, resend until a final receipt. */

static void journal_reading(struct device *d, const char *boot, int n)
{
    char msg_id[64], body[MAX_LINE];
    snprintf(msg_id, sizeof msg_id, "%s-%06d", boot, n);
    snprintf(body, sizeof body,
             "{\"msg_id\":\"%s\",\"ts\":%lld,\"payload\":{\"n\":%d,\"temp\":%.1f}}", msg_id,
             now_ms(), n, 60 + rand() % 300 / 10.0);
    add_pending(d, msg_id, body);
    save_journal(d); /* before it is published */
    cJSON *e = event("journaled");
    cJSON_AddStringToObject(e, "msg_id", msg_id);
    emit(e);
}

static void resend_due(struct mosquitto *m, struct device *d)
{
    double now = now_s();
    for (int i = 0; d->online && i < d->npending; i++) {
        struct pending *p = &d->pending[i];
        if (p->due > now)
            continue;
        publish(m, d, "up/telemetry", p->body, 0);
        p->due = now + p->timeout;
        p->timeout = p->timeout * 2 > 60 ? 60 : p->timeout * 2;
        cJSON *e = event("sent");
        cJSON_AddStringToObject(e, "msg_id", p->msg_id);
        emit(e);
    }
}

static void on_receipt(struct device *d, const cJSON *r)
{
    const char *msg_id = str_field(r, "msg_id"), *status = str_field(r, "status");
    const char *reason = str_field(r, "reason");
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(r, "seq");
    cJSON *e = event("receipt");
    add_shown(e, "msg_id", msg_id);
    add_shown(e, "status", status);
    if (cJSON_IsNumber(seq))
        cJSON_AddNumberToObject(e, "seq", seq->valuedouble);
    add_shown(e, "reason", reason);
    emit(e);
    if (!msg_id || !status)
        return;
    int final = !strcmp(status, "stored") || !strcmp(status, "delivered") ||
                !strcmp(status, "failed") ||
                (!strcmp(status, "rejected") && reason && strncmp(reason, "rate", 4) &&
                 strncmp(reason, "disk_budget", 11));
    for (int i = 0; final && i < d->npending; i++) {
        if (strcmp(d->pending[i].msg_id, msg_id))
            continue;
        /* Kept in journal order: the oldest is resent first. */
        memmove(&d->pending[i], &d->pending[i + 1],
                (size_t)(d->npending - i - 1) * sizeof d->pending[0]);
        d->npending--;
        save_journal(d);
        break;
    }
}

/* Downlinks: commit, then confirm. */

static void on_batch(struct mosquitto *m, struct device *d, const cJSON *batch)
{
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(batch, "messages"), *msg;
    unsigned long long upto = 0;
    FILE *f = fopen(d->inbox, "a");
    if (!f) {
        perror(d->inbox);
        return; /* unconfirmed: it comes again */
    }
    cJSON_ArrayForEach(msg, messages)
    {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(msg, "seq");
        if (!cJSON_IsNumber(seq) || seq->valuedouble < 1)
            continue;
        unsigned long long s = (unsigned long long)seq->valuedouble;
        upto = s > upto ? s : upto;
        if (s <= d->cursor)
            continue; /* had it: drop, and still confirm */
        char *line = cJSON_PrintUnformatted(msg);
        fprintf(f, "%s\n", line);
        free(line);
        d->cursor = s;
        cJSON *e = event("downlink");
        cJSON_AddNumberToObject(e, "seq", (double)s);
        add_shown(e, "msg_id", str_field(msg, "msg_id"));
        emit(e);
    }
    if (fsync_file(f) != 0 || fclose(f) != 0) {
        perror(d->inbox);
        return;
    }
    if (upto) {
        char body[64];
        snprintf(body, sizeof body, "{\"upto\":%llu}", upto);
        publish(m, d, "confirm", body, 0);
        cJSON *e = event("confirmed");
        cJSON_AddNumberToObject(e, "upto", (double)upto);
        emit(e);
    }
}

/* The connection. */

static void on_connect(struct mosquitto *m, void *obj, int rc)
{
    struct device *d = obj;
    char ack[128], inbox[128];
    if (rc) {
        cJSON *e = event("refused");
        add_shown(e, "rc", mosquitto_connack_string(rc));
        emit(e);
        return;
    }
    snprintf(ack, sizeof ack, "%s/ack", d->prefix);
    snprintf(inbox, sizeof inbox, "%s/inbox", d->prefix);
    char *const subs[] = {ack, inbox};
    mosquitto_subscribe_multiple(m, NULL, 2, subs, 1, 0, NULL);
}

static void on_subscribe(struct mosquitto *m, void *obj, int mid, int n, const int *granted)
{
    struct device *d = obj;
    (void)mid;
    for (int i = 0; i < n; i++) {
        if (granted[i] >= 0x80) {
            emit(event("subscribe_refused"));
            return;
        }
    }
    publish(m, d, "status", "{\"online\":true}", 1);
    publish(m, d, "pull", "{}", 0);
    d->online = 1;
    for (int i = 0; i < d->npending; i++)
        d->pending[i].due = 0; /* resend everything pending now */
    emit(event("online"));
}

static void on_message(struct mosquitto *m, void *obj, const struct mosquitto_message *msg)
{
    struct device *d = obj;
    cJSON *body = cJSON_ParseWithLength(msg->payload, (size_t)msg->payloadlen);
    size_t len = strlen(msg->topic);
    if (len >= 4 && !strcmp(msg->topic + len - 4, "/ack")) {
        const cJSON *r;
        if (cJSON_IsArray(body)) {
            cJSON_ArrayForEach(r, body) on_receipt(d, r);
        } else if (cJSON_IsObject(body)) {
            on_receipt(d, body);
        }
    } else if (len >= 6 && !strcmp(msg->topic + len - 6, "/inbox") && cJSON_IsObject(body)) {
        on_batch(m, d, body);
    }
    cJSON_Delete(body);
}

static int valid_id(const char *id)
{
    static const char allowed[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "abcdefghijklmnopqrstuvwxyz0123456789._-";
    size_t n = id ? strlen(id) : 0;
    return n >= 1 && n <= 64 && strspn(id, allowed) == n;
}

int main(int argc, char **argv)
{
    static struct option opts[] = {
        {"id", required_argument, 0, 'i'},       {"host", required_argument, 0, 'h'},
        {"port", required_argument, 0, 'p'},     {"data-dir", required_argument, 0, 'd'},
        {"send", required_argument, 0, 's'},     {"password-file", required_argument, 0, 'P'},
        {"exit-when-done", no_argument, 0, 'x'}, {"help", no_argument, 0, 'H'},
        {0, 0, 0, 0},
    };
    static const char usage[] =
        "usage: %s --id DEVICE_ID [--host H] [--port P] [--data-dir D] [--send N]\n"
        "       [--password-file F] [--exit-when-done]\n"
        "A field device for ferry: journals N readings, sends each until its\n"
        "receipt, commits and confirms downlinks; one JSON line per event.\n"
        "(a device id is [A-Za-z0-9._-]{1,64}; --host 127.0.0.1, --port 1883,\n"
        "--data-dir . by default)\n";
    static struct device d;
    const char *host = "127.0.0.1", *dir = ".", *password_file = NULL;
    int port = 1883, send = 0, exit_when_done = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'i': d.id = optarg; break;
        case 'h': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'd': dir = optarg; break;
        case 's': send = atoi(optarg); break;
        case 'P': password_file = optarg; break;
        case 'x': exit_when_done = 1; break;
        case 'H': printf(usage, argv[0]); return 0;
        default: return 64;
        }
    }
    if (!valid_id(d.id) || port < 1 || port > 65535 || send < 0 || optind < argc) {
        fprintf(stderr, usage, argv[0]);
        return 64;
    }
    snprintf(d.prefix, sizeof d.prefix, "devices/%s", d.id);
    snprintf(d.journal, sizeof d.journal, "%s/%s.journal", dir, d.id);
    snprintf(d.inbox, sizeof d.inbox, "%s/%s.inbox", dir, d.id);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    char boot[16];
    snprintf(boot, sizeof boot, "%08x", (unsigned)rand() ^ (unsigned)now_ms());
    load(&d);

    mosquitto_lib_init();
    struct mosquitto *m = mosquitto_new(d.id, true, &d);
    if (!m) {
        perror("mosquitto_new");
        return 1;
    }
    if (password_file) {
        char password[256] = "";
        FILE *f = fopen(password_file, "r");
        if (!f || !fgets(password, sizeof password, f)) {
            perror(password_file);
            return 64;
        }
        fclose(f);
        password[strcspn(password, "\r\n")] = 0;
        mosquitto_username_pw_set(m, d.id, password);
    }
    char will[128];
    snprintf(will, sizeof will, "%s/status", d.prefix);
    mosquitto_will_set(m, will, 16, "{\"online\":false}", 1, true);
    mosquitto_connect_callback_set(m, on_connect);
    mosquitto_subscribe_callback_set(m, on_subscribe);
    mosquitto_message_callback_set(m, on_message);
    mosquitto_connect(m, host, port, 30); /* a failure is retried below */

    int sent = 0;
    double backoff = 1, retry_at = 0;
    while (!stop) {
        if (sent < send && d.npending < MAX_PENDING)
            journal_reading(&d, boot, ++sent);
        resend_due(m, &d);
        if (exit_when_done && sent >= send && d.npending == 0)
            break;
        if (mosquitto_loop(m, 50, 1) != MOSQ_ERR_SUCCESS) {
            if (d.online)
                emit(event("disconnected"));
            d.online = 0;
            if (now_s() >= retry_at) {
                mosquitto_reconnect(m);
                retry_at = now_s() + backoff;
                backoff = backoff * 2 > 30 ? 30 : backoff * 2;
            } else {
                usleep(50000);
            }
        } else if (d.online) {
            backoff = 1;
        }
    }
    if (d.online) {
        publish(m, &d, "status", "{\"online\":false}", 1);
        for (int i = 0; i < 20 && mosquitto_want_write(m); i++)
            mosquitto_loop(m, 50, 1);
        mosquitto_disconnect(m);
        mosquitto_loop(m, 50, 1);
    }
    cJSON *e = event("stopped");
    cJSON_AddNumberToObject(e, "pending", d.npending);
    emit(e);
    mosquitto_destroy(m);
    mosquitto_lib_cleanup();
    return 0;
}
