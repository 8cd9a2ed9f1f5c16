// A foreign Kafka client for the interop tests on Apache Kafka: a small CLI
// over Apache Kafka's own Java client (kafka-clients, from the same Maven
// cache as the broker), so the Rust integration tests can check that what we
// write and commit reads the same from the client most services run.
//
// Run as a single-file program by `tests/it/interop.rs`:
//   java -cp "$KAFKA_RETRY_KAFKA_LIBS/*" KafkaClientPeer.java COMMAND ...
// It mirrors `tests/interop/kafka_client.py`: JSON on stdout (one document,
// or JSON lines for `consume`), errors on stderr with a non-zero exit, every
// operation bounded in time, no topic ever created. Security settings come
// from the suite's environment (KAFKA_RETRY_SECURITY_PROTOCOL, ...).

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HexFormat;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class KafkaClientPeer {
    /** How long a single broker round trip (committed offsets, a commit) may take. */
    static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(20);

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = parse(argv);
        double deadline = Double.parseDouble(args.getOrDefault("deadline-s", "60"));
        // A watchdog: even a call stuck inside the client cannot outlive the deadline.
        var watchdog = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "deadline");
            t.setDaemon(true);
            return t;
        });
        watchdog.schedule(() -> {
            System.err.println("error: the command outlived its deadline of " + deadline + " s");
            Runtime.getRuntime().halt(3);
        }, (long) (deadline * 1000), TimeUnit.MILLISECONDS);
        try {
            switch (args.get("command")) {
                case "committed" -> committed(args);
                case "consume" -> consume(args);
                case "describe" -> describe(args);
                case "topics" -> topics(args);
                default -> throw new IllegalArgumentException("unknown command " + args.get("command"));
            }
        } catch (Exception e) {
            System.err.println("error: " + e + (e.getCause() == null ? "" : " (" + e.getCause() + ")"));
            System.exit(1);
        }
        System.exit(0);
    }

    /** `COMMAND --name value --flag ...` into a map; flags map to "true". */
    static Map<String, String> parse(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--")) {
                args.put("command", a);
            } else if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                args.put(a.substring(2), argv[++i]);
            } else {
                args.put(a.substring(2), "true");
            }
        }
        if (!args.containsKey("command")) {
            throw new IllegalArgumentException("a command is required: committed, consume, describe or topics");
        }
        List<String> required = switch (args.get("command")) {
            case "describe" -> List.of("brokers", "group");
            case "topics" -> List.of("brokers", "topics");
            default -> List.of("brokers", "group", "topic");
        };
        for (String name : required) {
            if (!args.containsKey(name)) {
                throw new IllegalArgumentException("--" + name + " is required");
            }
        }
        return args;
    }

    static Properties consumerConfig(Map<String, String> args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args.get("brokers"));
        p.put("client.id", "kafka-retry-java-peer");
        p.put("group.id", args.get("group"));
        // The protocol our members speak, with the assignor they name.
        p.put("group.protocol", "classic");
        p.put("partition.assignment.strategy", "org.apache.kafka.clients.consumer.RangeAssignor");
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        // Tests create their topics; a typo must fail, not make a new one.
        p.put("allow.auto.create.topics", "false");
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("default.api.timeout.ms", String.valueOf(REQUEST_TIMEOUT.toMillis()));
        security(p);
        return p;
    }

    /** The suite's security settings, as Kafka's Java client takes them. */
    static void security(Properties p) throws Exception {
        String mechanism = System.getenv("KAFKA_RETRY_SASL_MECHANISM");
        String protocol = System.getenv("KAFKA_RETRY_SECURITY_PROTOCOL");
        if (protocol == null || protocol.isEmpty()) {
            protocol = mechanism != null ? "SASL_PLAINTEXT" : "PLAINTEXT";
        }
        p.put("security.protocol", protocol);
        if (mechanism != null && !mechanism.isEmpty()) {
            p.put("sasl.mechanism", mechanism);
            String module = mechanism.startsWith("SCRAM")
                ? "org.apache.kafka.common.security.scram.ScramLoginModule"
                : "org.apache.kafka.common.security.plain.PlainLoginModule";
            p.put("sasl.jaas.config", module + " required username=\"" + System.getenv("KAFKA_RETRY_SASL_USERNAME")
                + "\" password=\"" + System.getenv("KAFKA_RETRY_SASL_PASSWORD") + "\";");
        }
        String ca = System.getenv("KAFKA_RETRY_SSL_CA_LOCATION");
        if (ca != null && !ca.isEmpty()) {
            p.put("ssl.truststore.type", "PEM");
            p.put("ssl.truststore.location", ca);
        }
        String certificate = System.getenv("KAFKA_RETRY_SSL_CERTIFICATE_LOCATION");
        String key = System.getenv("KAFKA_RETRY_SSL_KEY_LOCATION");
        if (certificate != null && !certificate.isEmpty() && key != null && !key.isEmpty()) {
            p.put("ssl.keystore.type", "PEM");
            p.put("ssl.keystore.certificate.chain", Files.readString(Path.of(certificate)));
            p.put("ssl.keystore.key", Files.readString(Path.of(key)));
        }
    }

    /** Prints the group's committed offset of every partition of the topic, without joining it. */
    static void committed(Map<String, String> args) throws Exception {
        int partitions = Integer.parseInt(args.get("partitions"));
        try (var consumer = new KafkaConsumer<byte[], byte[]>(consumerConfig(args))) {
            Set<TopicPartition> wanted = new java.util.HashSet<>();
            for (int p = 0; p < partitions; p++) {
                wanted.add(new TopicPartition(args.get("topic"), p));
            }
            Map<TopicPartition, OffsetAndMetadata> offsets = consumer.committed(wanted, REQUEST_TIMEOUT);
            var result = new TreeMap<Integer, String>();
            for (TopicPartition tp : wanted) {
                OffsetAndMetadata o = offsets.get(tp);
                result.put(tp.partition(), o == null ? "null" : String.valueOf(o.offset()));
            }
            StringBuilder out = new StringBuilder("{");
            result.forEach((p, o) -> out.append(out.length() > 1 ? "," : "").append(json(String.valueOf(p))).append(":").append(o));
            System.out.println(out.append("}"));
        }
    }

    static Properties adminConfig(Map<String, String> args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args.get("brokers"));
        p.put("client.id", "kafka-retry-java-peer");
        p.put("request.timeout.ms", String.valueOf(REQUEST_TIMEOUT.toMillis()));
        p.put("default.api.timeout.ms", String.valueOf(REQUEST_TIMEOUT.toMillis()));
        security(p);
        return p;
    }

    /** Prints each topic's partitions with their leader and in-sync replicas (node ids). */
    static void topics(Map<String, String> args) throws Exception {
        try (Admin admin = Admin.create(adminConfig(args))) {
            List<String> names = List.of(args.get("topics").split(","));
            var described = admin.describeTopics(names).allTopicNames().get(REQUEST_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
            StringBuilder out = new StringBuilder("{");
            for (String name : names) {
                if (out.length() > 1) {
                    out.append(",");
                }
                out.append(json(name)).append(":[");
                boolean first = true;
                for (var partition : described.get(name).partitions()) {
                    out.append(first ? "" : ",");
                    first = false;
                    List<Integer> isr = new ArrayList<>();
                    partition.isr().forEach(n -> isr.add(n.id()));
                    isr.sort(null);
                    int leader = partition.leader() == null ? -1 : partition.leader().id();
                    out.append("{\"partition\":").append(partition.partition()).append(",\"leader\":").append(leader)
                        .append(",\"isr\":").append(isr.toString().replace(" ", "")).append("}");
                }
                out.append("]");
            }
            emit(out.append("}").toString());
        }
    }

    /** Prints the group as its coordinator describes it: state, coordinator, members, their instance ids and partitions. */
    static void describe(Map<String, String> args) throws Exception {
        try (Admin admin = Admin.create(adminConfig(args))) {
            ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(args.get("group")))
                .describedGroups().get(args.get("group")).get(REQUEST_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
            StringBuilder members = new StringBuilder("[");
            for (MemberDescription m : d.members()) {
                if (members.length() > 1) {
                    members.append(",");
                }
                List<Integer> ps = new ArrayList<>();
                m.assignment().topicPartitions().forEach(tp -> ps.add(tp.partition()));
                ps.sort(null);
                members.append("{\"member\":").append(json(m.consumerId()))
                    .append(",\"instance\":").append(m.groupInstanceId().map(KafkaClientPeer::json).orElse("null"))
                    .append(",\"partitions\":").append(ps.toString().replace(" ", "")).append("}");
            }
            int coordinator = d.coordinator() == null ? -1 : d.coordinator().id();
            emit("{\"state\":" + json(d.groupState().toString()) + ",\"coordinator\":" + coordinator
                + ",\"members\":" + members.append("]") + "}");
        }
    }

    /** Joins the group, prints what it is assigned and reads, leaves. */
    static void consume(Map<String, String> args) throws Exception {
        int maxRecords = Integer.parseInt(args.get("max-records"));
        long idleMillis = (long) (Double.parseDouble(args.get("idle-timeout-s")) * 1000);
        boolean commit = args.containsKey("commit");
        try (var consumer = new KafkaConsumer<byte[], byte[]>(consumerConfig(args))) {
            consumer.subscribe(List.of(args.get("topic")), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {}

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    List<Integer> ps = new ArrayList<>();
                    partitions.forEach(tp -> ps.add(tp.partition()));
                    ps.sort(null);
                    emit("{\"event\":\"assigned\",\"partitions\":" + ps.toString().replace(" ", "") + "}");
                }
            });
            int received = 0;
            long lastRecord = System.currentTimeMillis();
            while (received < maxRecords && System.currentTimeMillis() - lastRecord < idleMillis) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    emit(record(r));
                    if (commit) {
                        var tp = new TopicPartition(r.topic(), r.partition());
                        consumer.commitSync(Map.of(tp, new OffsetAndMetadata(r.offset() + 1)), REQUEST_TIMEOUT);
                    }
                    received++;
                    lastRecord = System.currentTimeMillis();
                    if (received >= maxRecords) {
                        break;
                    }
                }
            }
        }
        // Closed: it left the group, so a later member is not kept waiting.
        emit("{\"event\":\"closed\"}");
    }

    /** A record as JSON: its headers in order, duplicates kept, each value as text and as hex. */
    static String record(ConsumerRecord<byte[], byte[]> r) {
        StringBuilder headers = new StringBuilder("[");
        for (Header h : r.headers()) {
            if (headers.length() > 1) {
                headers.append(",");
            }
            byte[] v = h.value();
            headers.append("{\"name\":").append(json(h.key()))
                .append(",\"value\":").append(v == null ? "null" : json(new String(v, StandardCharsets.UTF_8)))
                .append(",\"hex\":").append(v == null ? "null" : json(HexFormat.of().formatHex(v))).append("}");
        }
        headers.append("]");
        return "{\"event\":\"record\",\"partition\":" + r.partition() + ",\"offset\":" + r.offset()
            + ",\"timestamp\":" + r.timestamp()
            + ",\"key\":" + (r.key() == null ? "null" : json(new String(r.key(), StandardCharsets.UTF_8)))
            + ",\"value\":" + (r.value() == null ? "null" : json(new String(r.value(), StandardCharsets.UTF_8)))
            + ",\"headers\":" + headers + "}";
    }

    static void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** A JSON string literal. */
    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append("\"").toString();
    }
}
