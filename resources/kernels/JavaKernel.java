// sandkasten Java kernel: one long-running JVM per code context, cells evaluated by the JDK's own `jdk.jshell` API with
// local execution (the cell's code runs in this JVM, so its variables, methods, classes and imports persist).
//
// Protocol: as python_kernel.py (one JSON object per line; stdin: {"id", "code", "env", "timeout_ms"}; stdout:
// "ready", "stream", "reply"). Run in the JDK's source-file mode (`java --source 17 FILE`, see `kernel_command`).
// A cell is split into snippets as jshell does; each is evaluated in turn, and the first that fails ends the cell:
// a snippet that does not compile is the error "CompilationException" (its diagnostics as the value), an exception the
// code throws is the error named by its class (its message as the value, its frames in the cell as the traceback).
// The value of a cell ending in an expression is its result (a String shown as its text, without quotes). System.out
// and System.err are captured as "stream" messages; System.in reads nothing (stdin is the protocol). `env` is set for
// the cell only and put back after it (the JVM's environment map is reached by reflection: the command opens
// java.util to this program). SIGINT (the host's interrupt) stops the running snippet, not the kernel.
// A variable or statement naming something undefined is a CompilationException; a method or class may name what a
// later cell defines (jshell's forward references). A snippet javac cannot generate (a string constant over 65535
// bytes) leaves jshell unable to compile anything again: the kernel then starts a new evaluator and the error says the
// context's state was reset.

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.DeclarationSnippet;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.MethodSnippet;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.TypeDeclSnippet;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public final class JavaKernel {
    /** The protocol's own descriptors, kept before System.out and System.in are replaced. */
    private static final OutputStream CHANNEL = new FileOutputStream(FileDescriptor.out);
    private static final InputStream REQUESTS = new BufferedInputStream(new FileInputStream(FileDescriptor.in), 1 << 16);
    /** How often captured output is forwarded while a cell runs. */
    private static final long FORWARD_EVERY_MS = 20;

    private static volatile Object currentId = null;
    private static volatile boolean inCell = false;
    /** Set by SIGINT while a cell runs: jshell reports a stopped snippet as if it had ended normally. */
    private static volatile boolean interrupted = false;
    private static int count = 0;
    /** The evaluator; replaced when a snippet leaves it unable to compile anything again (`freshShell`). */
    private static volatile JShell shell;

    static synchronized void send(Map<String, Object> message) {
        byte[] data = (Json.write(message) + "\n").getBytes(StandardCharsets.UTF_8);
        try {
            CHANNEL.write(data);
            CHANNEL.flush();
        } catch (IOException gone) {
            // The host closed the channel: the kernel is being shut down.
            Runtime.getRuntime().halt(0);
        }
    }

    static Map<String, Object> message(Object... pairs) {
        Map<String, Object> message = new LinkedHashMap<>();
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            message.put((String) pairs[i], pairs[i + 1]);
        }
        return message;
    }

    /** What a cell writes to System.out or System.err: held until the forwarder sends it as a "stream" message. */
    static final class Capture extends OutputStream {
        private final String name;
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();

        Capture(String name) {
            this.name = name;
        }

        @Override
        public synchronized void write(int b) {
            pending.write(b);
        }

        @Override
        public synchronized void write(byte[] bytes, int offset, int length) {
            pending.write(bytes, offset, length);
            if (pending.size() >= 1 << 16) {
                forward();
            }
        }

        /** Sends what is held, up to its last whole UTF-8 character. */
        synchronized void forward() {
            byte[] all = pending.toByteArray();
            int end = all.length;
            int back = 0;
            while (back < 3 && end - back - 1 >= 0 && (all[end - back - 1] & 0xC0) == 0x80) {
                back++;
            }
            if (end - back - 1 >= 0) {
                int lead = all[end - back - 1] & 0xFF;
                int size = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
                if (size > back + 1) {
                    end = end - back - 1;
                }
            }
            if (end == 0) {
                return;
            }
            pending.reset();
            pending.write(all, end, all.length - end);
            send(message("type", "stream", "id", currentId, "name", name,
                    "text", new String(all, 0, end, StandardCharsets.UTF_8)));
        }
    }

    private static final Capture STDOUT = new Capture("stdout");
    private static final Capture STDERR = new Capture("stderr");

    static void forwardAll() {
        System.out.flush();
        System.err.flush();
        STDOUT.forward();
        STDERR.forward();
    }

    /** The JVM's own environment map, writable (System.getenv() is a read-only view of it). */
    @SuppressWarnings("unchecked")
    static Map<String, String> writableEnvironment() {
        try {
            Map<String, String> view = System.getenv();
            Field inner = view.getClass().getDeclaredField("m");
            inner.setAccessible(true);
            return (Map<String, String>) inner.get(view);
        } catch (ReflectiveOperationException | RuntimeException unreachable) {
            return null;
        }
    }

    /** Sets the cell's variables; returns the previous values (null: unset) to put back. */
    static Map<String, String> setCellEnv(Object env) {
        Map<String, String> previous = new LinkedHashMap<>();
        Map<String, String> writable = writableEnvironment();
        if (!(env instanceof Map) || writable == null) {
            return previous;
        }
        for (Map.Entry<?, ?> entry : ((Map<?, ?>) env).entrySet()) {
            String name = String.valueOf(entry.getKey());
            previous.put(name, System.getenv(name));
            writable.put(name, String.valueOf(entry.getValue()));
        }
        return previous;
    }

    static void restoreEnv(Map<String, String> previous) {
        Map<String, String> writable = writableEnvironment();
        if (writable == null) {
            return;
        }
        for (Map.Entry<String, String> entry : previous.entrySet()) {
            if (entry.getValue() == null) {
                writable.remove(entry.getKey());
            } else {
                writable.put(entry.getKey(), entry.getValue());
            }
        }
    }

    static Map<String, Object> error(String name, String value, List<String> traceback) {
        return message("name", name, "value", value == null ? "" : value, "traceback", traceback);
    }

    static Map<String, Object> exceptionError(JShellException thrown) {
        List<String> traceback = new ArrayList<>();
        String name;
        if (thrown instanceof EvalException) {
            name = ((EvalException) thrown).getExceptionClassName();
        } else if (thrown instanceof UnresolvedReferenceException) {
            name = "UnresolvedReferenceException";
        } else {
            name = thrown.getClass().getSimpleName();
        }
        traceback.add(name + (thrown.getMessage() == null ? "" : ": " + thrown.getMessage()));
        // jshell keeps only the frames below the cell's snippets, naming a snippet's frame by the snippet (#N:line).
        for (StackTraceElement frame : thrown.getStackTrace()) {
            String method = frame.getClassName().isEmpty() ? frame.getMethodName()
                    : frame.getClassName() + "." + frame.getMethodName();
            traceback.add("\tat " + (method.isEmpty() ? "" : method + " ") + "(" + frame.getFileName() + ":" + frame.getLineNumber() + ")");
        }
        String value = thrown.getMessage();
        if (thrown instanceof UnresolvedReferenceException) {
            value = "a definition used here is not complete: " + ((UnresolvedReferenceException) thrown).getSnippet().source().trim();
        }
        return error(name, value, traceback);
    }

    /** The text/plain of a value jshell rendered: a String or a char as its content, anything else as rendered. */
    static String plainText(String type, String rendered) {
        boolean quoted = rendered.length() >= 2
                && ((type.equals("String") && rendered.startsWith("\"") && rendered.endsWith("\""))
                || (type.equals("char") && rendered.startsWith("'") && rendered.endsWith("'")));
        return quoted ? unescape(rendered.substring(1, rendered.length() - 1)) : rendered;
    }

    /** Undoes jshell's Java-literal escaping of a String's value. */
    static String unescape(String text) {
        StringBuilder plain = new StringBuilder(text.length());
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c != '\\' || i + 1 >= text.length()) {
                plain.append(c);
                continue;
            }
            char next = text.charAt(++i);
            switch (next) {
                case 'n': plain.append('\n'); break;
                case 't': plain.append('\t'); break;
                case 'r': plain.append('\r'); break;
                case 'b': plain.append('\b'); break;
                case 'f': plain.append('\f'); break;
                case 'u':
                    if (i + 4 < text.length()) {
                        plain.append((char) Integer.parseInt(text.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                    break;
                default: plain.append(next);
            }
        }
        return plain.toString();
    }

    /** Runs one cell: snippet by snippet; the reply's results and error. */
    static void runCell(String code, List<Object> results, Map<String, Object>[] failure) {
        JShell shell = JavaKernel.shell;
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String lastValue = null;
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            String source;
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            } else if (info.completeness().isComplete()) {
                source = info.source();
                remaining = info.remaining();
            } else {
                // Unfinished (a brace never closed): compiled as it is, for its diagnostics.
                source = remaining;
                remaining = "";
            }
            lastValue = null;
            List<SnippetEvent> events = shell.eval(source);
            if (interrupted) {
                failure[0] = error("KeyboardInterrupt", "the cell was interrupted", List.of());
                return;
            }
            for (SnippetEvent event : events) {
                if (event.causeSnippet() != null) {
                    continue;
                }
                Snippet snippet = event.snippet();
                String diagnostics = shell.diagnostics(snippet)
                        .filter(Diag::isError)
                        .map(diag -> diag.getMessage(Locale.ROOT))
                        .collect(Collectors.joining("\n"));
                if (event.status() == Snippet.Status.REJECTED) {
                    failure[0] = error("CompilationException", diagnostics, List.of(snippet.source().trim()));
                    return;
                }
                if (event.status() == Snippet.Status.RECOVERABLE_NOT_DEFINED) {
                    List<String> missing = snippet instanceof DeclarationSnippet
                            ? shell.unresolvedDependencies((DeclarationSnippet) snippet).collect(Collectors.toList())
                            : List.of();
                    if (missing.isEmpty()) {
                        // Compiled, yet not defined (javac could not generate it, e.g. a constant over 65535 bytes):
                        // jshell keeps the failure in every later compilation, even with the snippet dropped, so
                        // the only way on is a new evaluator, which the error says.
                        String why = diagnostics.isEmpty() ? "the snippet could not be defined" : diagnostics;
                        failure[0] = error("CompilationException", why + "; this context's Java state was reset, "
                                + "as jshell cannot compile anything after this", List.of(snippet.source().trim()));
                        shell.close();
                        JavaKernel.shell = freshShell();
                        return;
                    }
                    if (!(snippet instanceof MethodSnippet) && !(snippet instanceof TypeDeclSnippet)) {
                        // A method or class may name what a later cell defines; a variable or statement cannot wait.
                        failure[0] = error("CompilationException", "cannot find symbol: " + String.join(", ", missing),
                                List.of(snippet.source().trim()));
                        return;
                    }
                }
                if (event.exception() != null) {
                    failure[0] = exceptionError(event.exception());
                    return;
                }
                if (event.value() != null && snippet instanceof VarSnippet
                        && snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
                    lastValue = plainText(((VarSnippet) snippet).typeName(), event.value());
                } else if (event.value() != null && snippet instanceof ExpressionSnippet) {
                    lastValue = plainText(((ExpressionSnippet) snippet).typeName(), event.value());
                }
            }
        }
        if (lastValue != null) {
            results.add(message("is_main_result", true, "text/plain", lastValue));
        }
    }

    @SuppressWarnings("unchecked")
    static void handle(Map<String, Object> request) {
        count += 1;
        currentId = request.get("id");
        List<Object> results = new ArrayList<>();
        Map<String, Object>[] failure = new Map[1];
        Map<String, String> previousEnv = setCellEnv(request.get("env"));
        interrupted = false;
        inCell = true;
        try {
            runCell(String.valueOf(request.getOrDefault("code", "")), results, failure);
        } catch (IllegalStateException closed) {
            failure[0] = error("KernelError", "the evaluation engine ended: " + closed.getMessage(), List.of());
        } finally {
            inCell = false;
            restoreEnv(previousEnv);
        }
        forwardAll();
        send(message("type", "reply", "id", currentId, "execution_count", count, "results", results,
                "error", failure[0]));
    }

    static String readLine() throws IOException {
        ByteArrayOutputStream line = new ByteArrayOutputStream();
        while (true) {
            int b = REQUESTS.read();
            if (b < 0) {
                return line.size() == 0 ? null : line.toString(StandardCharsets.UTF_8);
            }
            if (b == '\n') {
                return line.toString(StandardCharsets.UTF_8);
            }
            line.write(b);
        }
    }

    /** A new evaluator in this JVM, its compiler loaded (the first evaluation loads it: done here, then forgotten). */
    static JShell freshShell() {
        JShell fresh = JShell.builder().executionEngine("local").build();
        for (SnippetEvent warm : fresh.eval("int sandkastenWarmUp = 0;")) {
            fresh.drop(warm.snippet());
        }
        return fresh;
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        System.setIn(InputStream.nullInputStream());
        System.setOut(new PrintStream(STDOUT, true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(STDERR, true, StandardCharsets.UTF_8));
        shell = freshShell();
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), signal -> {
            if (inCell) {
                interrupted = true;
                shell.stop();
            }
        });
        Thread forwarder = new Thread(() -> {
            while (true) {
                try {
                    Thread.sleep(FORWARD_EVERY_MS);
                } catch (InterruptedException ignored) {
                    return;
                }
                STDOUT.forward();
                STDERR.forward();
            }
        }, "sandkasten-forwarder");
        forwarder.setDaemon(true);
        forwarder.start();
        send(message("type", "ready", "language", "java", "pid", ProcessHandle.current().pid()));
        while (true) {
            String line = readLine();
            if (line == null) {
                break;
            }
            Object request;
            try {
                request = Json.parse(line);
            } catch (IllegalArgumentException malformed) {
                send(message("type", "reply", "id", null, "execution_count", count, "results", List.of(),
                        "error", error("ProtocolError", malformed.getMessage(), List.of())));
                continue;
            }
            if (!(request instanceof Map)) {
                send(message("type", "reply", "id", null, "execution_count", count, "results", List.of(),
                        "error", error("ProtocolError", "a request is a JSON object", List.of())));
                continue;
            }
            handle((Map<String, Object>) request);
        }
        forwardAll();
        Runtime.getRuntime().halt(0);
    }
}

/** The little JSON the protocol needs: requests parsed into maps, lists, strings, numbers, booleans and null. */
final class Json {
    private final String text;
    private int at;

    private Json(String text) {
        this.text = text;
    }

    static Object parse(String text) {
        Json parser = new Json(text);
        Object value = parser.value();
        parser.space();
        if (parser.at != text.length()) {
            throw new IllegalArgumentException("unexpected text after the JSON value at offset " + parser.at);
        }
        return value;
    }

    private void space() {
        while (at < text.length() && Character.isWhitespace(text.charAt(at))) {
            at++;
        }
    }

    private IllegalArgumentException malformed(String what) {
        return new IllegalArgumentException("malformed JSON at offset " + at + ": " + what);
    }

    private Object value() {
        space();
        if (at >= text.length()) {
            throw malformed("the text ended");
        }
        char c = text.charAt(at);
        switch (c) {
            case '{': return object();
            case '[': return array();
            case '"': return string();
            default:
                for (String word : new String[] {"true", "false", "null"}) {
                    if (text.startsWith(word, at)) {
                        at += word.length();
                        return word.equals("null") ? null : Boolean.valueOf(word);
                    }
                }
                return number();
        }
    }

    private Map<String, Object> object() {
        Map<String, Object> object = new LinkedHashMap<>();
        at++;
        space();
        if (at < text.length() && text.charAt(at) == '}') {
            at++;
            return object;
        }
        while (true) {
            space();
            if (at >= text.length() || text.charAt(at) != '"') {
                throw malformed("expected a key");
            }
            String key = string();
            space();
            if (at >= text.length() || text.charAt(at) != ':') {
                throw malformed("expected ':'");
            }
            at++;
            object.put(key, value());
            space();
            if (at < text.length() && text.charAt(at) == ',') {
                at++;
            } else if (at < text.length() && text.charAt(at) == '}') {
                at++;
                return object;
            } else {
                throw malformed("expected ',' or '}'");
            }
        }
    }

    private List<Object> array() {
        List<Object> array = new ArrayList<>();
        at++;
        space();
        if (at < text.length() && text.charAt(at) == ']') {
            at++;
            return array;
        }
        while (true) {
            array.add(value());
            space();
            if (at < text.length() && text.charAt(at) == ',') {
                at++;
            } else if (at < text.length() && text.charAt(at) == ']') {
                at++;
                return array;
            } else {
                throw malformed("expected ',' or ']'");
            }
        }
    }

    private String string() {
        StringBuilder out = new StringBuilder();
        at++;
        while (at < text.length()) {
            char c = text.charAt(at++);
            if (c == '"') {
                return out.toString();
            }
            if (c != '\\') {
                out.append(c);
                continue;
            }
            if (at >= text.length()) {
                break;
            }
            char escaped = text.charAt(at++);
            switch (escaped) {
                case 'n': out.append('\n'); break;
                case 't': out.append('\t'); break;
                case 'r': out.append('\r'); break;
                case 'b': out.append('\b'); break;
                case 'f': out.append('\f'); break;
                case 'u':
                    if (at + 4 > text.length()) {
                        throw malformed("a short \\u escape");
                    }
                    out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                    at += 4;
                    break;
                default: out.append(escaped);
            }
        }
        throw malformed("a string never ended");
    }

    private Object number() {
        int start = at;
        while (at < text.length() && "+-0123456789.eE".indexOf(text.charAt(at)) >= 0) {
            at++;
        }
        String digits = text.substring(start, at);
        try {
            return digits.matches("-?\\d+") ? (Object) Long.valueOf(digits) : (Object) Double.valueOf(digits);
        } catch (NumberFormatException notANumber) {
            throw malformed("expected a value");
        }
    }

    static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out);
        return out.toString();
    }

    private static void write(Object value, StringBuilder out) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof String) {
            quote((String) value, out);
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                quote(String.valueOf(entry.getKey()), out);
                out.append(':');
                write(entry.getValue(), out);
            }
            out.append('}');
        } else if (value instanceof List) {
            out.append('[');
            boolean first = true;
            for (Object item : (List<?>) value) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(item, out);
            }
            out.append(']');
        } else {
            quote(String.valueOf(value), out);
        }
    }

    private static void quote(String text, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20 || Character.isSurrogate(c) && !validSurrogate(text, i)) {
                        out.append(String.format("\\u%04x", (int) (c < 0x20 ? c : 0xFFFD)));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }

    /** A surrogate that is half of a pair (a lone one cannot be encoded as UTF-8 and is sent as U+FFFD). */
    private static boolean validSurrogate(String text, int i) {
        char c = text.charAt(i);
        if (Character.isHighSurrogate(c)) {
            return i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1));
        }
        return i > 0 && Character.isHighSurrogate(text.charAt(i - 1));
    }
}
