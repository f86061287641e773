// The progress display: its numbers (amounts, rates, time left), the bar fitted to a width, log
// lines only when something moved, and nothing at all when off.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace sieve {
namespace {

using namespace std::chrono_literals;

TEST(Progress, Formats) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12.5 * 1024 * 1024), "12.5 MiB");
  EXPECT_EQ(format_bytes(300.0 * 1024 * 1024 * 1024), "300 GiB");
  EXPECT_EQ(format_duration(7.4), "0:07");
  EXPECT_EQ(format_duration(125), "2:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(1.0 / 0.0), "--:--");
}

TEST(Progress, LinesSayAmountRateAndTimeLeft) {
  std::vector<std::string> lines;
  Progress p({.label = "gsm8k", .total = 200, .unit = "q", .style = ProgressStyle::Lines,
              .line_interval_s = 3600, .line_sink = [&](const std::string& l) { lines.push_back(l); }});
  p.add(50);
  EXPECT_EQ(p.render(10.0), "gsm8k: 50/200 q (25%), 5.00 q/s, 0:10 elapsed, 0:30 left");
  p.set_note("acc 0.52");
  p.add(150);
  EXPECT_EQ(p.render(20.0), "gsm8k: 200/200 q (100%), 10.0 q/s, 0:20 elapsed, acc 0.52");
  EXPECT_TRUE(lines.empty());  // none until an interval passes or the end
  p.finish();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("gsm8k: 200/200 q (100%)", 0), 0u);
  p.finish();  // once only
  EXPECT_EQ(lines.size(), 1u);
}

TEST(Progress, BytesWithoutATotal) {
  Progress p({.label = "weights", .bytes = true, .style = ProgressStyle::Off});
  p.add(3u << 20);
  EXPECT_EQ(p.render(2.0), "weights  3.00 MiB  1.50 MiB/s  0:02");
  p.set_total(6u << 20);
  EXPECT_EQ(p.render(2.0).rfind("weights  50% [", 0), 0u);
}

TEST(Progress, BarFitsTheWidth) {
  Progress p({.label = "bench", .total = 64, .unit = "req", .style = ProgressStyle::Off, .width = 80});
  p.add(16);
  const std::string s = p.render(8.0);
  EXPECT_LE(s.size(), 79u);
  EXPECT_EQ(s.rfind("bench  25% [", 0), 0u) << s;
  const size_t open = s.find('['), close = s.find(']');
  ASSERT_NE(close, std::string::npos);
  const std::string bar = s.substr(open + 1, close - open - 1);
  EXPECT_EQ(std::count(bar.begin(), bar.end(), '#'), long(bar.size() / 4));
  EXPECT_NE(s.find("]  16/64 req  2.00 req/s  0:08<0:24"), std::string::npos) << s;
  Progress narrow({.label = "bench", .total = 64, .style = ProgressStyle::Off, .width = 30});
  EXPECT_EQ(narrow.render(1.0).find('['), std::string::npos);  // no room for a bar
  EXPECT_LE(narrow.render(1.0).size(), 29u);
}

TEST(Progress, BarRedrawsInPlaceAndEndsTheLine) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ASSERT_TRUE(f);
  {
    Progress p({.label = "x", .total = 10, .style = ProgressStyle::Bar, .out = f, .redraw_interval_s = 0.001,
                .width = 60});
    for (int i = 0; i < 10; ++i) {
      p.add(1);
      std::this_thread::sleep_for(3ms);
    }
  }  // the destructor finishes
  std::fclose(f);
  const std::string out(buf, len);
  std::free(buf);
  EXPECT_GE(std::count(out.begin(), out.end(), '\r'), 2);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_NE(out.find("x  100% ["), std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
}

TEST(Progress, QuietWhenNothingMoves) {
  std::vector<std::string> lines;
  {
    Progress p({.label = "idle", .total = 5, .style = ProgressStyle::Lines, .line_interval_s = 0.001,
                .line_sink = [&](const std::string& l) { lines.push_back(l); }});
    p.add(1);
    std::this_thread::sleep_for(50ms);
  }
  // One line for the move (none for the start, however late the add comes), one at the end; not
  // one per interval. On a loaded machine the reporter may not wake before the end: then only the
  // end's line.
  ASSERT_GE(lines.size(), 1u);
  EXPECT_LE(lines.size(), 2u);
  EXPECT_NE(lines.back().find("1/5"), std::string::npos) << lines.back();
}

}  // namespace
}  // namespace sieve
