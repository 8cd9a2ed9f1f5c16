package billing.peer;

import java.io.IOException;
import java.math.BigDecimal;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.kafka.annotation.BackOff;
import org.springframework.kafka.annotation.DltHandler;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.support.KafkaHeaders;
import org.springframework.messaging.handler.annotation.Header;
import org.springframework.stereotype.Component;

import tools.jackson.core.JacksonException;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.ObjectMapper;

/**
 * The billing listener as a Spring Kafka user writes it: on each
 * OrderConfirmed event, charge the customer through the billing provider
 * under the order id as idempotency key; transient failures climb Spring's
 * retry topics, permanent ones go to its dead-letter topic.
 *
 * <p>Configured by the environment: KAFKA_BROKERS, PEER_TOPIC, PEER_GROUP,
 * PEER_PROVIDER_URL, PEER_ATTEMPTS (first try included), PEER_DELAY_MS and
 * PEER_MULTIPLIER (the delays of the retry topics), PEER_PARTITIONS,
 * PEER_CONCURRENCY, PEER_DEFAULT_CURRENCY, PEER_PROVIDER_TIMEOUT_MS.
 *
 * <p>It prints one JSON line per dead letter its DLT handler receives, prefixed
 * with "dead-letter ", for the tests to read.
 */
@SpringBootApplication
public class BillingPeer {
    public static void main(String[] args) throws IOException {
        SpringApplication app = new SpringApplication(BillingPeer.class);
        app.setDefaultProperties(security());
        app.run(args);
    }

    /**
     * The test suite's security settings (KAFKA_RETRY_SECURITY_PROTOCOL,
     * KAFKA_RETRY_SASL_*, KAFKA_RETRY_SSL_*, PEM files) as Kafka client
     * properties for the consumer, producer and admin alike.
     */
    static Map<String, Object> security() throws IOException {
        Map<String, Object> p = new LinkedHashMap<>();
        String mechanism = env("KAFKA_RETRY_SASL_MECHANISM");
        String protocol = env("KAFKA_RETRY_SECURITY_PROTOCOL");
        if (protocol == null) {
            protocol = mechanism != null ? "SASL_PLAINTEXT" : "PLAINTEXT";
        }
        String prefix = "spring.kafka.properties.";
        p.put(prefix + "security.protocol", protocol);
        if (mechanism != null) {
            String module = mechanism.startsWith("SCRAM")
                    ? "org.apache.kafka.common.security.scram.ScramLoginModule"
                    : "org.apache.kafka.common.security.plain.PlainLoginModule";
            p.put(prefix + "sasl.mechanism", mechanism);
            p.put(prefix + "sasl.jaas.config", module + " required username=\"" + env("KAFKA_RETRY_SASL_USERNAME")
                    + "\" password=\"" + env("KAFKA_RETRY_SASL_PASSWORD") + "\";");
        }
        String ca = env("KAFKA_RETRY_SSL_CA_LOCATION");
        if (ca != null) {
            p.put(prefix + "ssl.truststore.type", "PEM");
            p.put(prefix + "ssl.truststore.location", ca);
        }
        String certificate = env("KAFKA_RETRY_SSL_CERTIFICATE_LOCATION");
        String key = env("KAFKA_RETRY_SSL_KEY_LOCATION");
        if (certificate != null && key != null) {
            p.put(prefix + "ssl.keystore.type", "PEM");
            p.put(prefix + "ssl.keystore.certificate.chain", Files.readString(Path.of(certificate)));
            p.put(prefix + "ssl.keystore.key", Files.readString(Path.of(key)));
        }
        return p;
    }

    private static String env(String name) {
        String value = System.getenv(name);
        return value == null || value.isEmpty() ? null : value;
    }
}

/** A failure that a retry cannot cure: straight to the dead-letter topic. */
class PermanentFailure extends RuntimeException {
    PermanentFailure(String message) {
        super(message);
    }
}

/** A failure a later attempt may not meet: to the next retry topic. */
class TransientFailure extends RuntimeException {
    TransientFailure(String message) {
        super(message);
    }
}

@Component
class Charger {
    private static final Logger LOG = LoggerFactory.getLogger(Charger.class);

    /** Client errors that a wrong URL or credentials give every order: an outage. */
    private static final Set<Integer> TRANSIENT_4XX = Set.of(401, 403, 404, 405, 407, 408, 425, 429);

    private final ObjectMapper json = new ObjectMapper();
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private final String provider;
    private final String defaultCurrency;
    private final Duration timeout;

    Charger(
            @Value("${PEER_PROVIDER_URL}") String provider,
            @Value("${PEER_DEFAULT_CURRENCY:EUR}") String defaultCurrency,
            @Value("${PEER_PROVIDER_TIMEOUT_MS:5000}") long timeoutMs) {
        this.provider = provider.replaceAll("/+$", "");
        this.defaultCurrency = defaultCurrency;
        this.timeout = Duration.ofMillis(timeoutMs);
    }

    @RetryableTopic(
            attempts = "${PEER_ATTEMPTS:4}",
            backOff = @BackOff(delayString = "${PEER_DELAY_MS:1000}", multiplierString = "${PEER_MULTIPLIER:2.0}"),
            numPartitions = "${PEER_PARTITIONS:3}",
            replicationFactor = "-1",
            exclude = PermanentFailure.class,
            traversingCauses = "true")
    @KafkaListener(topics = "${PEER_TOPIC}", groupId = "${PEER_GROUP}")
    void onOrder(ConsumerRecord<String, String> record) {
        Order order = Order.parse(json, record.value(), defaultCurrency);
        charge(order);
    }

    @DltHandler
    void onDeadLetter(
            ConsumerRecord<String, String> record,
            @Header(name = KafkaHeaders.ORIGINAL_TOPIC, required = false) String originalTopic,
            @Header(name = KafkaHeaders.EXCEPTION_FQCN, required = false) String exception,
            @Header(name = KafkaHeaders.EXCEPTION_MESSAGE, required = false) String message) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("topic", record.topic());
        line.put("partition", record.partition());
        line.put("offset", record.offset());
        line.put("key", record.key());
        line.put("original_topic", originalTopic);
        line.put("exception", exception);
        line.put("message", message);
        System.out.println("dead-letter " + json.writeValueAsString(line));
    }

    /** Charges `order` once under its order id; throws what went wrong, classified. */
    private void charge(Order order) {
        String key = order.orderId().toString();
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("order_id", order.orderId().toString());
        body.put("customer_id", order.customerId().toString());
        body.put("amount", order.amount().toPlainString());
        body.put("currency", order.currency());
        HttpResponse<String> answer = send(HttpRequest.newBuilder(URI.create(provider + "/charges"))
                .header("Content-Type", "application/json")
                .header("Idempotency-Key", key)
                .POST(HttpRequest.BodyPublishers.ofString(json.writeValueAsString(body))));
        int status = answer.statusCode();
        if (status >= 200 && status < 300) {
            LOG.info("charged order {}", key);
            return;
        }
        if (status == 409) {
            alreadyCharged(order, key);
            return;
        }
        throw classified(status, "the provider answered " + status + " to the charge of order " + key);
    }

    /** After a 409: succeeds when the provider holds a completed charge of these terms. */
    private void alreadyCharged(Order order, String key) {
        HttpResponse<String> answer = send(HttpRequest.newBuilder(URI.create(provider + "/charges/" + key)).GET());
        if (answer.statusCode() != 200) {
            throw new TransientFailure("the provider answered " + answer.statusCode() + " about the charge of order " + key);
        }
        JsonNode charge;
        try {
            charge = json.readTree(answer.body());
        } catch (JacksonException e) {
            throw new TransientFailure("the provider's answer about order " + key + " is not JSON");
        }
        boolean same = order.orderId().toString().equals(charge.path("order_id").asString())
                && order.customerId().toString().equals(charge.path("customer_id").asString())
                && order.currency().equals(charge.path("currency").asString())
                && sameAmount(order.amount(), charge.path("amount").asString());
        if (!same) {
            throw new PermanentFailure("the idempotency key " + key + " was used for another charge");
        }
        String status = charge.path("status").asString();
        if (!status.equals("succeeded")) {
            throw new TransientFailure("the charge of order " + key + " is " + status);
        }
        LOG.info("order {} was already charged", key);
    }

    private static boolean sameAmount(BigDecimal amount, String text) {
        try {
            return amount.compareTo(new BigDecimal(text)) == 0;
        } catch (NumberFormatException e) {
            return false;
        }
    }

    private HttpResponse<String> send(HttpRequest.Builder request) {
        try {
            return http.send(request.timeout(timeout).build(), HttpResponse.BodyHandlers.ofString());
        } catch (HttpTimeoutException e) {
            throw new TransientFailure("the provider did not answer within " + timeout.toMillis() + " ms");
        } catch (IOException e) {
            throw new TransientFailure("cannot reach the provider: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new TransientFailure("interrupted");
        }
    }

    private static RuntimeException classified(int status, String message) {
        if (status >= 500 || TRANSIENT_4XX.contains(status)) {
            return new TransientFailure(message);
        }
        return new PermanentFailure(message);
    }
}

/** An OrderConfirmed event, as much of it as a charge needs. */
record Order(UUID orderId, UUID customerId, BigDecimal amount, String currency) {
    /** Decodes and checks an event; a payload that is not one is a permanent failure. */
    static Order parse(ObjectMapper json, String payload, String defaultCurrency) {
        if (payload == null || payload.isBlank()) {
            throw new PermanentFailure("payload is empty: expected an OrderConfirmedEvent JSON object");
        }
        try {
            JsonNode event = json.readTree(payload);
            UUID orderId = UUID.fromString(event.path("order_id").asString());
            UUID customerId = UUID.fromString(event.path("customer_id").asString());
            BigDecimal amount = new BigDecimal(event.path("total_amount").asString());
            if (amount.signum() <= 0) {
                throw new PermanentFailure("total_amount must be positive, got " + amount.toPlainString());
            }
            JsonNode currency = event.path("currency");
            String code = currency.isMissingNode() || currency.isNull() ? defaultCurrency : currency.asString();
            return new Order(orderId, customerId, amount.setScale(Math.max(2, amount.scale())), code);
        } catch (JacksonException | IllegalArgumentException e) {
            throw new PermanentFailure("not an OrderConfirmedEvent: " + e.getMessage());
        }
    }
}
