package io.readaheadd.hdfsbench;

import java.io.BufferedReader;
import java.io.File;
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.concurrent.Callable;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.hdfs.DistributedFileSystem;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.protocol.LocatedBlock;

/**
 * Runs a real, unmodified MiniDFSCluster (one NameNode, one DataNode, in this JVM) with its
 * storage under a given directory and serves benchmark commands read from stdin, one per line.
 * Every command gets exactly one JSON line on stdout; everything else (Hadoop's logs included)
 * goes to stderr, because System.out is redirected there before Hadoop starts.
 *
 * <pre>
 *   write PATH SIZE_MB          write SIZE_MB MiB of random-ish bytes, fsync the block files
 *   read PATH[,PATH...] [N]     N concurrent readers (reader i reads path i mod #paths)
 *   blocks PATH                 local block files of PATH
 *   stream PATH[,PATH...] N     start N clients streaming the files until stop (see Streamer)
 *   progress                    bytes the stream's clients have read so far
 *   stop                        stop the stream; its bytes
 *   delete PATH                 remove PATH from HDFS
 *   quit                        shut the cluster down and exit (also on end of stdin)
 * </pre>
 *
 * The DataNode reads block files with its stock code path: short-circuit reads are off, so
 * block data goes to the client over a local TCP connection with sendfile (transferTo).
 */
public final class Server {
  private static final long MIB = 1L << 20;
  private static final long BLOCK_SIZE = 256 * MIB;

  private final PrintStream out;
  private final MiniDFSCluster cluster;
  private final DistributedFileSystem fs;
  private final File dataDir;
  private final int readBuffer;
  private final byte[] pool;
  private Streamer streamer; // the running stream, if any

  private Server(PrintStream out, MiniDFSCluster cluster, int readBuffer) throws IOException {
    this.out = out;
    this.cluster = cluster;
    this.fs = cluster.getFileSystem();
    this.dataDir = new File(cluster.getDataDirectory());
    this.readBuffer = readBuffer;
    // A few MiB of pseudo-random bytes, written at shifting offsets: incompressible data
    // without paying for a PRNG on every byte of a multi-GB write.
    this.pool = new byte[(int) (4 * MIB)];
    new SplittableRandom(0x5eed).nextBytes(pool);
  }

  public static void main(String[] args) throws Exception {
    // Answers own stdout; anything that prints to System.out (Hadoop included) goes to stderr.
    PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
    System.setOut(System.err);

    if (args.length < 1) {
      System.err.println("usage: Server BASEDIR [READ_BUFFER_BYTES]");
      System.exit(2);
    }
    String baseDir = new File(args[0]).getAbsolutePath();
    int readBuffer = args.length > 1 ? Integer.parseInt(args[1]) : (int) MIB;

    long t0 = System.nanoTime();
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, baseDir);
    conf.setLong("dfs.blocksize", BLOCK_SIZE);
    conf.setInt("dfs.replication", 1);
    // The DataNode's normal remote read path: no short-circuit, block data sent with sendfile.
    conf.setBoolean("dfs.client.read.shortcircuit", false);
    conf.setBoolean("dfs.datanode.transferTo.allowed", true);
    // The volume scanner would read every new block in the background at 1 MB/s and blur
    // the device's read pattern; 0 turns it off (a configuration switch, not a code change).
    conf.setLong("dfs.block.scanner.volume.bytes.per.second", 0);
    // Quiet the web UIs onto ephemeral ports so several clusters can coexist.
    conf.set("dfs.namenode.http-address", "127.0.0.1:0");
    conf.set("dfs.datanode.http.address", "127.0.0.1:0");

    MiniDFSCluster cluster;
    try {
      cluster = new MiniDFSCluster.Builder(conf)
          .numDataNodes(1)
          .storagesPerDatanode(1)
          .format(true)
          .build();
      cluster.waitActive();
    } catch (Throwable e) {
      out.println(error("start: " + e));
      e.printStackTrace();
      System.exit(1);
      return;
    }
    double startSeconds = (System.nanoTime() - t0) / 1e9;

    Server s = new Server(out, cluster, readBuffer);
    Map<String, Object> ready = new TreeMap<>();
    ready.put("ok", true);
    ready.put("event", "ready");
    ready.put("pid", ProcessHandle.current().pid());
    ready.put("uri", s.fs.getUri().toString());
    ready.put("data_dir", s.dataDir.getAbsolutePath());
    ready.put("datanode_xfer_port", cluster.getDataNodes().get(0).getXferPort());
    ready.put("start_seconds", startSeconds);
    out.println(Json.encode(ready));

    int code = s.serve();
    System.exit(code);
  }

  private int serve() {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    try {
      String line;
      while ((line = in.readLine()) != null) {
        line = line.trim();
        if (line.isEmpty()) {
          continue;
        }
        String[] f = line.split("\\s+");
        if (f[0].equals("quit")) {
          break;
        }
        String answer;
        try {
          answer = Json.encode(dispatch(f));
        } catch (Throwable e) {
          System.err.println("command failed: " + line);
          e.printStackTrace();
          answer = error(f[0] + ": " + e);
        }
        out.println(answer);
      }
    } catch (IOException e) {
      System.err.println("reading commands: " + e);
    }
    // Reached on quit or when stdin closes (the controlling process went away).
    if (streamer != null) {
      try {
        streamer.stop();
      } catch (Throwable e) {
        System.err.println("stopping the stream: " + e);
      }
      streamer = null;
    }
    long t0 = System.nanoTime();
    try {
      cluster.shutdown();
    } catch (Throwable e) {
      out.println(error("shutdown: " + e));
      return 1;
    }
    Map<String, Object> bye = new TreeMap<>();
    bye.put("ok", true);
    bye.put("event", "shutdown");
    bye.put("seconds", (System.nanoTime() - t0) / 1e9);
    out.println(Json.encode(bye));
    return 0;
  }

  private Map<String, Object> dispatch(String[] f) throws Exception {
    switch (f[0]) {
      case "write":
        need(f, 3, "write PATH SIZE_MB");
        return write(f[1], Long.parseLong(f[2]));
      case "read":
        if (f.length != 2 && f.length != 3) {
          throw new IllegalArgumentException("usage: read PATH[,PATH...] [THREADS]");
        }
        String[] paths = f[1].split(",");
        int threads = f.length == 3 ? Integer.parseInt(f[2]) : paths.length;
        return read(paths, threads);
      case "blocks":
        need(f, 2, "blocks PATH");
        Map<String, Object> r = new TreeMap<>();
        r.put("ok", true);
        r.put("path", f[1]);
        r.put("bytes", fs.getFileStatus(new org.apache.hadoop.fs.Path(f[1])).getLen());
        r.put("blocks", blockFiles(f[1]));
        return r;
      case "stream":
        need(f, 3, "stream PATH[,PATH...] THREADS");
        if (streamer != null) {
          throw new IllegalStateException("a stream is running: stop it first");
        }
        String[] sp = f[1].split(",");
        List<List<String>> spBlocks = new ArrayList<>();
        for (String p : sp) {
          spBlocks.add(blockFiles(p));
        }
        streamer = new Streamer(sp, spBlocks, Integer.parseInt(f[2]));
        return streamer.progress();
      case "progress":
        need(f, 1, "progress");
        if (streamer == null) {
          throw new IllegalStateException("no stream running");
        }
        return streamer.progress();
      case "stop":
        need(f, 1, "stop");
        if (streamer == null) {
          throw new IllegalStateException("no stream running");
        }
        Streamer st = streamer;
        streamer = null;
        st.stop();
        return st.progress();
      case "delete":
        need(f, 2, "delete PATH");
        Map<String, Object> d = new TreeMap<>();
        d.put("ok", true);
        d.put("deleted", fs.delete(new org.apache.hadoop.fs.Path(f[1]), true));
        return d;
      default:
        throw new IllegalArgumentException(
            "unknown command " + f[0] + " (want write, read, blocks, stream, progress, stop, delete, quit)");
    }
  }

  private static void need(String[] f, int n, String usage) {
    if (f.length != n) {
      throw new IllegalArgumentException("usage: " + usage);
    }
  }

  private Map<String, Object> write(String path, long sizeMB) throws Exception {
    if (sizeMB <= 0) {
      throw new IllegalArgumentException("SIZE_MB must be positive, got " + sizeMB);
    }
    long total = sizeMB * MIB;
    long t0 = System.nanoTime();
    org.apache.hadoop.fs.Path p = new org.apache.hadoop.fs.Path(path);
    try (FSDataOutputStream os = fs.create(p, true, (int) MIB, (short) 1, BLOCK_SIZE)) {
      int chunk = (int) MIB;
      for (long off = 0, i = 0; off < total; off += chunk, i++) {
        int start = (int) ((i * 7919 * 4099) % (pool.length - chunk));
        os.write(pool, start, chunk);
      }
    }
    double writeSeconds = (System.nanoTime() - t0) / 1e9;
    List<String> blocks = blockFiles(path);
    // Push the block files to the device so FIEMAP sees their physical extents
    // (ext4 allocates delayed-allocation data only at writeback).
    for (String b : blocks) {
      try (FileChannel ch = FileChannel.open(Path.of(b), StandardOpenOption.READ)) {
        ch.force(true);
      }
    }
    Map<String, Object> r = new TreeMap<>();
    r.put("ok", true);
    r.put("path", path);
    r.put("bytes", total);
    r.put("seconds", writeSeconds);
    r.put("blocks", blocks);
    return r;
  }

  /** Local block files of path: blk_ID files (not .meta) under the DataNode's data dir. */
  private List<String> blockFiles(String path) throws Exception {
    org.apache.hadoop.fs.Path p = new org.apache.hadoop.fs.Path(path);
    long len = fs.getFileStatus(p).getLen();
    List<Long> ids = new ArrayList<>();
    for (LocatedBlock lb : fs.getClient().getLocatedBlocks(path, 0, len).getLocatedBlocks()) {
      ids.add(lb.getBlock().getBlockId());
    }
    // The DataNode moves a replica from rbw/ to finalized/ as the last packet is acked;
    // allow a moment for that before giving up.
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (true) {
      Map<Long, String> found = findBlocks(ids);
      if (found.size() == ids.size()) {
        List<String> files = new ArrayList<>();
        for (long id : ids) {
          files.add(found.get(id));
        }
        return files;
      }
      if (System.nanoTime() > deadline) {
        throw new IOException("found " + found.size() + " of " + ids.size()
            + " block files of " + path + " under " + dataDir);
      }
      Thread.sleep(100);
    }
  }

  private Map<Long, String> findBlocks(List<Long> ids) throws IOException {
    Set<String> want = new HashSet<>();
    for (long id : ids) {
      want.add("blk_" + id);
    }
    Map<Long, String> found = new TreeMap<>();
    try (Stream<Path> walk = Files.walk(dataDir.toPath())) {
      walk.filter(q -> want.contains(q.getFileName().toString()))
          .filter(q -> q.toString().contains(File.separator + "finalized" + File.separator))
          .forEach(q -> found.put(
              Long.parseLong(q.getFileName().toString().substring(4)), q.toString()));
    }
    return found;
  }

  private Map<String, Object> read(String[] paths, int threads) throws Exception {
    if (threads < 1) {
      throw new IllegalArgumentException("THREADS must be at least 1, got " + threads);
    }
    CyclicBarrier start = new CyclicBarrier(threads);
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    List<Future<long[]>> results = new ArrayList<>();
    long t0;
    try {
      t0 = System.nanoTime();
      for (int i = 0; i < threads; i++) {
        String path = paths[i % paths.length];
        Callable<long[]> task = () -> {
          byte[] buf = new byte[readBuffer];
          start.await();
          long s = System.nanoTime();
          long n = 0;
          try (FSDataInputStream in = fs.open(new org.apache.hadoop.fs.Path(path), readBuffer)) {
            int k;
            while ((k = in.read(buf, 0, buf.length)) > 0) {
              n += k;
            }
          }
          return new long[] {n, System.nanoTime() - s};
        };
        results.add(pool.submit(task));
      }
      List<Object> readers = new ArrayList<>();
      long total = 0;
      for (int i = 0; i < threads; i++) {
        long[] res = results.get(i).get();
        total += res[0];
        Map<String, Object> one = new TreeMap<>();
        one.put("path", paths[i % paths.length]);
        one.put("bytes", res[0]);
        one.put("seconds", res[1] / 1e9);
        one.put("mbps", res[0] / 1e6 / (res[1] / 1e9));
        readers.add(one);
      }
      double secs = (System.nanoTime() - t0) / 1e9;
      Map<String, Object> r = new TreeMap<>();
      r.put("ok", true);
      r.put("bytes", total);
      r.put("seconds", secs);
      r.put("mbps", total / 1e6 / secs);
      r.put("readers", readers);
      return r;
    } finally {
      pool.shutdownNow();
    }
  }

  /**
   * Clients streaming HDFS files until stopped, as a DataNode's readers do: of N clients,
   * client c owns files c, c+N, c+2N, ... and reads them whole, one after another, over and
   * over, each through a new FSDataInputStream (so the DataNode opens the block file anew).
   * No two clients read one file: one would find the pages the other just read in the page
   * cache and follow it at no cost to the device. After a whole pass over a file the client
   * evicts its block files from the page cache (coreutils dd iflag=nocache count=0:
   * posix_fadvise DONTNEED), so every pass reads the device, as a DataNode serving more data
   * than memory does. Bytes count as they arrive.
   */
  private final class Streamer {
    private final AtomicLong bytes = new AtomicLong();
    private final AtomicLong passes = new AtomicLong();
    private final AtomicReference<Throwable> failure = new AtomicReference<>();
    private final List<Thread> threads = new ArrayList<>();
    private volatile boolean stopping;

    Streamer(String[] paths, List<List<String>> blocks, int n) {
      if (n < 1 || n > paths.length) {
        throw new IllegalArgumentException(
            "THREADS must be 1 to the number of files (" + paths.length + "), got " + n);
      }
      for (int c = 0; c < n; c++) {
        final int first = c;
        Thread t = new Thread(() -> {
          byte[] buf = new byte[readBuffer];
          try {
            for (int i = first; !stopping; i = i + n < paths.length ? i + n : first) {
              boolean whole = false;
              try (FSDataInputStream in = fs.open(new org.apache.hadoop.fs.Path(paths[i]), readBuffer)) {
                int got;
                while (!stopping && (got = in.read(buf, 0, buf.length)) > 0) {
                  bytes.addAndGet(got);
                }
                whole = !stopping;
              }
              if (whole) {
                passes.incrementAndGet();
                for (String b : blocks.get(i)) {
                  evict(b);
                }
              }
            }
          } catch (Throwable e) {
            failure.compareAndSet(null, e);
            stopping = true;
          }
        }, "stream-client-" + c);
        t.setDaemon(true);
        threads.add(t);
      }
      for (Thread t : threads) {
        t.start();
      }
    }

    void stop() throws InterruptedException {
      stopping = true;
      for (Thread t : threads) {
        t.join(60_000);
        if (t.isAlive()) {
          throw new IllegalStateException(t.getName() + " still reading 60 s after stop");
        }
      }
    }

    Map<String, Object> progress() {
      Throwable e = failure.get();
      if (e != null) {
        throw new IllegalStateException("stream client failed: " + e, e);
      }
      Map<String, Object> r = new TreeMap<>();
      r.put("ok", true);
      r.put("bytes", bytes.get());
      r.put("passes", passes.get());
      return r;
    }
  }

  /** Evicts a block file from the page cache. */
  private static void evict(String file) throws IOException, InterruptedException {
    Process p = new ProcessBuilder("dd", "if=" + file, "iflag=nocache", "count=0", "status=none")
        .redirectErrorStream(true)
        .start();
    String msg = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
    if (p.waitFor() != 0) {
      throw new IOException("evict " + file + " from the page cache (dd iflag=nocache): " + msg);
    }
  }

  private static String error(String msg) {
    Map<String, Object> r = new TreeMap<>();
    r.put("ok", false);
    r.put("error", msg);
    return Json.encode(r);
  }
}
