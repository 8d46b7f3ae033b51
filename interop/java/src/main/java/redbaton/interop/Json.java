package redbaton.interop;

import java.util.Collection;

/** A JSON object written field by field: enough for the driver's replies, no dependency. */
final class Json {
    private final StringBuilder out = new StringBuilder("{");

    Json put(String key, Object value) {
        if (out.length() > 1) {
            out.append(',');
        }
        string(key);
        out.append(':');
        value(value);
        return this;
    }

    private void value(Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Integer || value instanceof Long) {
            out.append(value);
        } else if (value instanceof Double d) {
            out.append(Double.isFinite(d) ? String.format(java.util.Locale.ROOT, "%.3f", d) : "null");
        } else if (value instanceof Json json) {
            out.append(json);
        } else if (value instanceof Collection<?> items) {
            out.append('[');
            boolean first = true;
            for (Object item : items) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                value(item);
            }
            out.append(']');
        } else {
            string(value.toString());
        }
    }

    private void string(String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    @Override
    public String toString() {
        return out + "}";
    }
}
