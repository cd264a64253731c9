package vitals.peer;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The peer of e2e-bench: an exactly-once (v2) Kafka Streams application doing a simpler version of
 * vitals' job on the same signals topic. Every record is decoded (Avro single-object encoding, the
 * schema found by its fingerprint among schemas/*.avsc); each call outcome updates its endpoint's
 * 30 s window (calls, failures) and state in a changelogged key-value store; an endpoint whose
 * window holds 20+ calls at 50 %+ failures is ejected and readmitted under 10 %, each change
 * written to the output topic. Prints how fast it read the first --records records.
 *
 * <p>java -cp target/classes:target/lib/* vitals.peer.Peer --brokers B --topic T --records N
 * --output T2 --schemas DIR [--threads 1] [--store persistent|memory]
 *
 * <p>The store is Kafka Streams' default, persistent (RocksDB), as a production application runs
 * it; {@code --store memory} keeps it in memory (both changelogged).
 */
public final class Peer {
  static final AtomicLong processed = new AtomicLong();
  static final AtomicLong decodeErrors = new AtomicLong();
  static final AtomicLong changes = new AtomicLong();
  static volatile long firstNanos;
  static volatile long doneNanos;
  static final CountDownLatch done = new CountDownLatch(1);
  static long target;

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      a.put(argv[i], argv[i + 1]);
    }
    String brokers = a.getOrDefault("--brokers", "127.0.0.1:9092");
    String topic = require(a, "--topic");
    String output = require(a, "--output");
    target = Long.parseLong(require(a, "--records"));
    File schemas = new File(require(a, "--schemas"));
    int threads = Integer.parseInt(a.getOrDefault("--threads", "1"));
    String app = a.getOrDefault("--app-id", "vitals-peer-" + System.nanoTime());
    String store = a.getOrDefault("--store", "persistent");
    if (!store.equals("persistent") && !store.equals("memory")) {
      System.err.println("--store: persistent or memory, not " + store);
      System.exit(2);
    }

    Map<Long, Schema> bySchema = new HashMap<>();
    for (File f : schemas.listFiles((d, n) -> n.endsWith(".avsc"))) {
      Schema s = new Schema.Parser().parse(Files.readString(f.toPath()));
      bySchema.put(SchemaNormalization.parsingFingerprint64(s), s);
    }

    Topology t = new Topology();
    t.addSource("signals", Serdes.ByteArray().deserializer(), Serdes.ByteArray().deserializer(), topic);
    t.addProcessor("health", () -> new Health(bySchema), "signals");
    t.addStateStore(
        Stores.keyValueStoreBuilder(
                store.equals("memory")
                    ? Stores.inMemoryKeyValueStore("endpoints")
                    : Stores.persistentKeyValueStore("endpoints"),
                Serdes.String(),
                Serdes.ByteArray())
            .withCachingEnabled(),
        "health");
    t.addSink("changes", output, Serdes.String().serializer(), Serdes.String().serializer(), "health");

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("vitals-peer").toString());
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // The processor's fetch settings (8 MB per partition, 20 ms wait).
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG), 8 * 1024 * 1024);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG), 20);
    KafkaStreams streams = new KafkaStreams(t, p);
    streams.start();
    long last = System.nanoTime();
    while (!done.await(1, TimeUnit.SECONDS)) {
      if (System.nanoTime() - last > 10_000_000_000L) {
        System.err.printf("peer: %d of %d%n", processed.get(), target);
        last = System.nanoTime();
      }
    }
    double secs = (doneNanos - firstNanos) / 1e9;
    System.out.printf(
        "peer: %d records in %.3f s, %.0f records/s, %d changes, %d not decoded%n",
        target, secs, target / secs, changes.get(), decodeErrors.get());
    System.out.flush();
    streams.close(Duration.ofSeconds(30));
  }

  static String require(Map<String, String> a, String k) {
    String v = a.get(k);
    if (v == null) {
      System.err.println("missing " + k);
      System.exit(2);
    }
    return v;
  }

  static final class Health implements Processor<byte[], byte[], String, String> {
    final Map<Long, GenericDatumReader<GenericRecord>> readers = new HashMap<>();
    BinaryDecoder decoder;
    GenericRecord reuse;
    ProcessorContext<String, String> ctx;
    KeyValueStore<String, byte[]> store;

    Health(Map<Long, Schema> schemas) {
      schemas.forEach((fp, s) -> readers.put(fp, new GenericDatumReader<>(s)));
    }

    @Override
    public void init(ProcessorContext<String, String> context) {
      ctx = context;
      store = context.getStateStore("endpoints");
    }

    @Override
    public void process(Record<byte[], byte[]> r) {
      long n = processed.incrementAndGet();
      if (n == 1) {
        firstNanos = System.nanoTime();
        // The benchmark samples CPU from here: start-up and group join are not counted.
        System.out.println("peer: first record");
        System.out.flush();
      }
      try {
        byte[] v = r.value();
        long fp = ByteBuffer.wrap(v, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
        GenericDatumReader<GenericRecord> reader = readers.get(fp);
        if (v[0] != (byte) 0xC3 || v[1] != 0x01 || reader == null) {
          decodeErrors.incrementAndGet();
        } else {
          decoder = DecoderFactory.get().binaryDecoder(v, 10, v.length - 10, decoder);
          GenericRecord rec = reader.read(null, decoder);
          if (rec.getSchema().getName().equals("CallOutcome")) {
            call(rec, r.timestamp());
          }
        }
      } catch (Exception e) {
        decodeErrors.incrementAndGet();
      }
      if (n == target) {
        doneNanos = System.nanoTime();
        done.countDown();
      }
    }

    void call(GenericRecord c, long ts) {
      String key = c.get("pool") + "\u0000" + c.get("endpoint");
      String outcome = c.get("outcome").toString();
      boolean failed =
          !(outcome.equals("SUCCESS") || outcome.equals("CLIENT_ERROR") || outcome.equals("CANCELLED"));
      byte[] old = store.get(key);
      ByteBuffer s = ByteBuffer.allocate(17);
      long start = ts;
      int calls = 0;
      int failures = 0;
      byte state = 0;
      if (old != null) {
        ByteBuffer b = ByteBuffer.wrap(old);
        start = b.getLong();
        calls = b.getInt();
        failures = b.getInt();
        state = b.get();
        if (ts - start >= 30_000) {
          start = ts;
          calls = 0;
          failures = 0;
        }
      }
      calls++;
      if (failed) {
        failures++;
      }
      byte next = state;
      if (calls >= 20 && state == 0 && failures * 2 >= calls) {
        next = 1;
      } else if (calls >= 20 && state == 1 && failures * 10 < calls) {
        next = 0;
      }
      if (next != state) {
        changes.incrementAndGet();
        ctx.forward(new Record<>(key, next == 1 ? "ejected" : "healthy", ts));
      }
      s.putLong(start).putInt(calls).putInt(failures).put(next);
      store.put(key, s.array());
    }
  }
}
