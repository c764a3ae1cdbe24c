/* The JSON Lines records of a page of events, written in C for the common case.
 *
 * Why: `agentrt-export jsonl` spends most of its time turning events into
 * records (checking that each payload is JSON, that its time is in the
 * runtime's stored form and that its ids need no escapes). This module does
 * those checks and writes the record for an event in the runtime's own form;
 * for anything else (an id to escape, a time in another form, a payload that
 * is blank, not JSON, or merely unusual) it calls the Python
 * `jsonl_record` it is given, which stays the one definition of a record.
 * It therefore only ever says "this is what Python would write"; it never
 * decides that a payload is invalid. Tests hold the two paths byte-equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Nesting deeper than this goes to Python (whose verdict depends on its
 * recursion limit); the runtime's payloads nest a few levels. */
#define MAX_DEPTH 64

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

static int
reserve(Buffer *b, Py_ssize_t more)
{
    if (more > PY_SSIZE_T_MAX - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = b->len + more;
    if (need <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 65536;
    while (cap < need)
        cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Append n bytes; room must have been reserved. */
static void
put(Buffer *b, const void *bytes, Py_ssize_t n)
{
    memcpy(b->data + b->len, bytes, (size_t)n);
    b->len += n;
}

/* Whether an exact str is ASCII (a legacy string that cannot be made ready
 * is left to Python, its error cleared). */
static int
ascii_ready(PyObject *s)
{
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return 0;
    }
    return PyUnicode_IS_ASCII(s);
}

/* The bytes of an exact str that JSON writes between quotes as they are
 * (printable ASCII without '"' or '\\'), or NULL. */
static const char *
plain_text(PyObject *s, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(s) || !ascii_ready(s))
        return NULL;
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\')
            return NULL;
    }
    *n = len;
    return (const char *)p;
}

static int
two_digits(const unsigned char *p, int *value)
{
    if (p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9')
        return 0;
    *value = (p[0] - '0') * 10 + (p[1] - '0');
    return 1;
}

static int
days_in(int year, int month)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return days[month - 1] + (month == 2 && leap);
}

/* Whether a stored time is in the record's form already: a real UTC second
 * YYYY-MM-DDTHH:MM:SS, then 'Z' or a fraction of one to nine digits with no
 * trailing zero and 'Z' (what the runtime stores). */
static int
stored_time(const unsigned char *p, Py_ssize_t n)
{
    int century, year, month, day, hour, minute, second;
    if (n < 20 || n > 30)
        return 0;
    if (!two_digits(p, &century) || !two_digits(p + 2, &year) || p[4] != '-'
        || !two_digits(p + 5, &month) || p[7] != '-' || !two_digits(p + 8, &day)
        || p[10] != 'T' || !two_digits(p + 11, &hour) || p[13] != ':'
        || !two_digits(p + 14, &minute) || p[16] != ':' || !two_digits(p + 17, &second))
        return 0;
    year += century * 100;
    if (year < 1 || month < 1 || month > 12 || day < 1 || day > days_in(year, month)
        || hour > 23 || minute > 59 || second > 59)
        return 0;
    if (p[n - 1] != 'Z')
        return 0;
    if (n == 20)
        return 1;
    if (p[19] != '.' || n < 22 || p[n - 2] == '0')
        return 0;
    for (Py_ssize_t i = 20; i < n - 1; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/* The length of the UTF-8 sequence starting at p[i] (its first byte >= 0x80)
 * if it is well formed (no overlong form, no surrogate, nothing past
 * U+10FFFF), else 0. */
static Py_ssize_t
utf8_sequence(const unsigned char *p, Py_ssize_t n, Py_ssize_t i)
{
    unsigned char c = p[i], low = 0x80, high = 0xbf;
    Py_ssize_t len;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            low = 0xa0;
        else if (c == 0xed)
            high = 0x9f;
    }
    else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            low = 0x90;
        else if (c == 0xf4)
            high = 0x8f;
    }
    else
        return 0;
    if (len > n - i || p[i + 1] < low || p[i + 1] > high)
        return 0;
    for (Py_ssize_t k = 2; k < len; k++)
        if (p[i + k] < 0x80 || p[i + k] > 0xbf)
            return 0;
    return len;
}

static int
hex_digit(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The code of the \uXXXX escape at p[i] (p[i] is '\\'), or -1. */
static int
escaped_code(const unsigned char *p, Py_ssize_t n, Py_ssize_t i)
{
    if (n - i < 6 || p[i + 1] != 'u')
        return -1;
    int code = 0;
    for (int k = 2; k < 6; k++) {
        int d = hex_digit(p[i + k]);
        if (d < 0)
            return -1;
        code = code * 16 + d;
    }
    return code;
}

/* Move *at past the JSON string starting there (at a '"'); 0 when it is not
 * one, or holds an escaped surrogate that is not half of a pair (left to
 * Python: orjson refuses it, the strict decoder takes it). A pair, as
 * Python's json.dumps writes an emoji, is taken. */
static int
skip_string(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at)
{
    Py_ssize_t i = *at + 1;
    while (i < n) {
        unsigned char c = p[i];
        if (c == '"') {
            *at = i + 1;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c < 0x80 && c != '\\') {
            i++;
            continue;
        }
        if (c >= 0x80) {
            Py_ssize_t len = utf8_sequence(p, n, i);
            if (len == 0)
                return 0;
            i += len;
            continue;
        }
        if (i + 1 >= n)
            return 0;
        c = p[i + 1];
        if (c == 'u') {
            int code = escaped_code(p, n, i);
            if (code < 0 || (code >= 0xdc00 && code <= 0xdfff))
                return 0;
            i += 6;
            if (code >= 0xd800 && code <= 0xdbff) {  /* its low half must follow */
                int low = i < n && p[i] == '\\' ? escaped_code(p, n, i) : -1;
                if (low < 0xdc00 || low > 0xdfff)
                    return 0;
                i += 6;
            }
        }
        else if (strchr("\"\\/bfnrt", c) != NULL && c != '\0')
            i += 2;
        else
            return 0;
    }
    return 0;
}

static int
is_digit(const unsigned char *p, Py_ssize_t n, Py_ssize_t i)
{
    return i < n && p[i] >= '0' && p[i] <= '9';
}

/* Move *at past the JSON number starting there; 0 when it is not one, or
 * when it might be out of a double's range (more than 200 integer digits, an
 * exponent of three digits or more): orjson refuses those, and Python's
 * strict decoder then decides, with a verdict that can depend on its stack. */
static int
skip_number(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at)
{
    Py_ssize_t i = *at;
    if (i < n && p[i] == '-')
        i++;
    if (!is_digit(p, n, i))
        return 0;
    Py_ssize_t digits = i;
    if (p[i] == '0')
        i++;
    else
        while (is_digit(p, n, i))
            i++;
    if (i - digits > 200)
        return 0;
    if (i < n && p[i] == '.') {
        i++;
        if (!is_digit(p, n, i))
            return 0;
        while (is_digit(p, n, i))
            i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        digits = i;
        if (!is_digit(p, n, i))
            return 0;
        while (is_digit(p, n, i))
            i++;
        if (i - digits > 2)
            return 0;
    }
    *at = i;
    return 1;
}

static int
skip_word(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at, const char *word)
{
    Py_ssize_t len = (Py_ssize_t)strlen(word);
    if (n - *at < len || memcmp(p + *at, word, (size_t)len) != 0)
        return 0;
    *at += len;
    return 1;
}

static int
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* i moved past JSON whitespace, *spaced set when there was some. */
static Py_ssize_t
skip_space(const unsigned char *p, Py_ssize_t n, Py_ssize_t i, int *spaced)
{
    while (i < n && is_space(p[i])) {
        i++;
        *spaced = 1;
    }
    return i;
}

/* Whether p[0:n] is one JSON value nesting at most MAX_DEPTH deep: 1 when it
 * has no whitespace outside its strings (the record embeds it as it is), 2
 * when it has some (the record embeds it without, see put_compacted), 0 when
 * it is not such a value (left to Python). */
static int
compact_json(const unsigned char *p, Py_ssize_t n)
{
    char closers[MAX_DEPTH];
    int depth = 0, spaced = 0;
    Py_ssize_t i = 0;

value:
    i = skip_space(p, n, i, &spaced);
    if (i >= n)
        return 0;
    switch (p[i]) {
    case '{':
    case '[':
        if (depth == MAX_DEPTH)
            return 0;
        closers[depth++] = p[i] == '{' ? '}' : ']';
        i = skip_space(p, n, i + 1, &spaced);
        if (i < n && p[i] == closers[depth - 1]) {
            depth--;
            i++;
            goto after;
        }
        if (closers[depth - 1] == '}')
            goto key;
        goto value;
    case '"':
        if (!skip_string(p, n, &i))
            return 0;
        goto after;
    case 't':
        if (!skip_word(p, n, &i, "true"))
            return 0;
        goto after;
    case 'f':
        if (!skip_word(p, n, &i, "false"))
            return 0;
        goto after;
    case 'n':
        if (!skip_word(p, n, &i, "null"))
            return 0;
        goto after;
    default:
        if (!skip_number(p, n, &i))
            return 0;
        goto after;
    }

key:
    i = skip_space(p, n, i, &spaced);
    if (i >= n || p[i] != '"' || !skip_string(p, n, &i))
        return 0;
    i = skip_space(p, n, i, &spaced);
    if (i >= n || p[i] != ':')
        return 0;
    i++;
    goto value;

after:
    i = skip_space(p, n, i, &spaced);
    if (depth == 0)
        return i == n ? 1 + spaced : 0;
    if (i >= n)
        return 0;
    if (p[i] == ',') {
        i++;
        if (closers[depth - 1] == '}')
            goto key;
        goto value;
    }
    if (p[i] == closers[depth - 1]) {
        depth--;
        i++;
        goto after;
    }
    return 0;
}

/* Append p[0:n], a JSON value compact_json accepted, without the whitespace
 * outside its strings: what jsonl_record's _compacted makes of it. Room for
 * n bytes must have been reserved. */
static void
put_compacted(Buffer *b, const unsigned char *p, Py_ssize_t n)
{
    int in_string = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            b->data[b->len++] = (char)c;
            if (c == '\\')
                b->data[b->len++] = (char)p[++i];  /* an escape's second byte: never the end */
            else if (c == '"')
                in_string = 0;
        }
        else if (!is_space(c)) {
            b->data[b->len++] = (char)c;
            in_string = c == '"';
        }
    }
}

/* Append the record of checked fields to b (the payload as compact_json's
 * form says); 1, or -1 on an error. */
static int
put_record(Buffer *b, long long number, const char *run_id, Py_ssize_t run_len,
           const char *step_id, Py_ssize_t step_len, const unsigned char *at_text,
           Py_ssize_t at_len, const char *type, Py_ssize_t type_len,
           const unsigned char *json, Py_ssize_t json_len, int form)
{
    char seq_text[32];
    int seq_len = snprintf(seq_text, sizeof seq_text, "%lld", number);
    static const char seq_key[] = "{\"seq\":", run_key[] = ",\"run_id\":\"",
        step_key[] = "\",\"step_id\":\"", at_key[] = "\",\"at\":\"",
        type_key[] = "\",\"type\":\"", payload_key[] = "\",\"payload\":";
    Py_ssize_t size = 80 + seq_len + run_len + step_len + at_len + type_len + json_len;
    if (reserve(b, size) < 0)
        return -1;
    put(b, seq_key, sizeof seq_key - 1);
    put(b, seq_text, seq_len);
    put(b, run_key, sizeof run_key - 1);
    put(b, run_id, run_len);
    if (step_len) {
        put(b, step_key, sizeof step_key - 1);
        put(b, step_id, step_len);
    }
    put(b, at_key, sizeof at_key - 1);
    put(b, at_text, at_len);
    put(b, type_key, sizeof type_key - 1);
    put(b, type, type_len);
    put(b, payload_key, sizeof payload_key - 1);
    if (form == 1)
        put(b, json, json_len);
    else
        put_compacted(b, json, json_len);
    put(b, "}\n", 2);
    return 1;
}

/* Write the record of an event in the runtime's own form into b; 0 when the
 * event is not in that form (nothing written), -1 on an error. */
static int
write_record(Buffer *b, PyObject *event)
{
    if (PyTuple_GET_SIZE(event) != 6)
        return 0;
    PyObject *seq = PyTuple_GET_ITEM(event, 0);
    PyObject *payload = PyTuple_GET_ITEM(event, 5);
    PyObject *at = PyTuple_GET_ITEM(event, 3);
    Py_ssize_t run_len, step_len, type_len;
    const char *run_id = plain_text(PyTuple_GET_ITEM(event, 1), &run_len);
    const char *step_id = plain_text(PyTuple_GET_ITEM(event, 2), &step_len);
    const char *type = plain_text(PyTuple_GET_ITEM(event, 4), &type_len);
    if (run_id == NULL || step_id == NULL || type == NULL || !PyLong_CheckExact(seq)
        || !PyBytes_CheckExact(payload) || !PyUnicode_CheckExact(at) || !ascii_ready(at))
        return 0;
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(seq, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    const unsigned char *at_text = PyUnicode_1BYTE_DATA(at);
    Py_ssize_t at_len = PyUnicode_GET_LENGTH(at);
    const unsigned char *json = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t json_len = PyBytes_GET_SIZE(payload);
#ifdef JSONLPAGE_EXACT_COPIES
    /* A test build (tests/test_jsonl_page.py, under AddressSanitizer): parse
     * and copy out of copies with no byte after them, where a bytes or str
     * object's own allocation holds a NUL that would hide a read one byte
     * past its end. */
    unsigned char *time_copy = malloc(at_len ? (size_t)at_len : 1);
    unsigned char *json_copy = malloc(json_len ? (size_t)json_len : 1);
    int form = 0;
    if (time_copy != NULL && json_copy != NULL) {
        memcpy(time_copy, at_text, (size_t)at_len);
        memcpy(json_copy, json, (size_t)json_len);
        form = stored_time(time_copy, at_len) ? compact_json(json_copy, json_len) : 0;
    }
    free(time_copy);
    int written = form ? put_record(b, number, run_id, run_len, step_id, step_len, at_text,
                                    at_len, type, type_len, json_copy, json_len, form) : 0;
    free(json_copy);
    return written;
#else
    int form = stored_time(at_text, at_len) ? compact_json(json, json_len) : 0;
    return form ? put_record(b, number, run_id, run_len, step_id, step_len, at_text, at_len,
                             type, type_len, json, json_len, form) : 0;
#endif
}

PyDoc_STRVAR(join_records_doc,
"join_records(events, types, fallback, /) -> bytes\n\n"
"The JSON Lines records of events, joined: written here for an event of one\n"
"of the exact types in its runtime's own form, by fallback(event) (which\n"
"must return bytes) for any other.");

static PyObject *
join_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "join_records takes events, types and fallback");
        return NULL;
    }
    PyObject *types = args[1], *fallback = args[2];
    if (!PyTuple_Check(types)) {
        PyErr_SetString(PyExc_TypeError, "join_records: types must be a tuple of types");
        return NULL;
    }
    /* A tuple of its own: the fallback, Python code, cannot change it. */
    PyObject *events = PySequence_Tuple(args[0]);
    if (events == NULL)
        return NULL;
    Buffer b = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(events); i++) {
        PyObject *event = PyTuple_GET_ITEM(events, i);
        int known = 0;
        for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(types); t++)
            known |= (PyObject *)Py_TYPE(event) == PyTuple_GET_ITEM(types, t);
        int written = known && PyTuple_Check(event) ? write_record(&b, event) : 0;
        if (written < 0)
            goto fail;
        if (written)
            continue;
        PyObject *record = PyObject_CallOneArg(fallback, event);
        if (record == NULL)
            goto fail;
        if (!PyBytes_Check(record)) {
            PyTypeObject *type = Py_TYPE(record);
            Py_INCREF(type);
            Py_DECREF(record);
            PyErr_Format(PyExc_TypeError, "join_records: fallback returned %.100s, not bytes",
                         type->tp_name);
            Py_DECREF(type);
            goto fail;
        }
        if (reserve(&b, PyBytes_GET_SIZE(record)) < 0) {
            Py_DECREF(record);
            goto fail;
        }
        put(&b, PyBytes_AS_STRING(record), PyBytes_GET_SIZE(record));
        Py_DECREF(record);
    }
    Py_DECREF(events);
    PyObject *joined = PyBytes_FromStringAndSize(b.data ? b.data : "", b.len);
    PyMem_Free(b.data);
    return joined;

fail:
    Py_DECREF(events);
    PyMem_Free(b.data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"join_records", (PyCFunction)(void (*)(void))join_records, METH_FASTCALL, join_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "agentrt._jsonlpage",
    "The JSON Lines records of a page of events, in C for the runtime's own form.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__jsonlpage(void)
{
    return PyModule_Create(&module);
}
