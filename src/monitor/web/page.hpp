// The dashboard's page and script (page.cpp), served by Dashboard.
#pragma once

#include <string_view>

namespace starling::monitor {
std::string_view page_html();
std::string_view page_script();
}  // namespace starling::monitor
