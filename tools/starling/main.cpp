#include <iostream>
int main() { std::cout << "starling\n"; }
