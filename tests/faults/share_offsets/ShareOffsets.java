// A share group's state read back from the broker (tests/faults/share_state.py runs it):
// Admin.listShareGroupOffsets (KIP-932's DescribeShareGroupOffsets), which confluent-kafka
// 2.16.1 does not have. Prints one line per partition: "topic partition startOffset lag"
// (lag "-" when the broker gives none), then "ok".
//   java -cp kafka-clients.jar:slf4j-api.jar:DIR ShareOffsets BOOTSTRAP GROUP
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.common.TopicPartition;

public class ShareOffsets {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "30000");
        try (Admin admin = Admin.create(p)) {
            Map<TopicPartition, SharePartitionOffsetInfo> got = admin
                .listShareGroupOffsets(Map.of(args[1], new ListShareGroupOffsetsSpec()))
                .partitionsToOffsetInfo(args[1]).get();
            for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> e : got.entrySet()) {
                SharePartitionOffsetInfo info = e.getValue();
                if (info == null) {
                    continue;
                }
                System.out.println(e.getKey().topic() + " " + e.getKey().partition() + " "
                    + info.startOffset() + " " + info.lag().map(String::valueOf).orElse("-"));
            }
        }
        System.out.println("ok");
    }
}
